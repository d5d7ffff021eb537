"""Do the models use long-range context? The probes of Sun, Krishna, Mattarella-Micke and Iyyer
(EMNLP 2021) for any checkpoint the Scorer restores (docs/probes.md): token level, perturbations
of the first m tokens, sequence copy, suffix identification.

data: books of a PG-19-layout folder, encoded with the checkpoint's vocabulary; sampling: the
inputs and targets (the same for every prefix length, perturbation and model); categories: the
token categories; scoring: score_fn(inputs, targets) -> nll, one pass per input; run: the probe
for several models and prefix lengths, resumable; perturbations, suffix: the other probes (pure
numpy); runners: those per model, resumable; report: JSON, markdown and PNG plots;
demo: the probe of `make demo`. `python -m routing_transformer.tools.probes --help`.
"""
