"""The probe of `make demo`: routing, local and routing-as-local on the test books.

    markdown = demo.run(output_dir, books_dir, data_dir)   # after both demo models are trained

Prefix lengths 256 ... 2,048 (the demo models' L); targets at [-50:-40] of each input as in the
paper; the books read as datagen read them (`reading`, `problems.pg19_reading`); "far" = last
seen, in the target's 2,048-token input, further back than the local model's receptive field
(layers x (block + flange - 1) tokens), so a far target can only be copied through the routing
heads; every category is fixed from that full-length input, the same tokens at every N.
Writes <output>/probes/ (JSON, tables, PNGs) and returns the markdown for summary.md.
"""
import os
import sys
import time

from routing_transformer.tools.probes import data
from routing_transformer.tools.probes import probe
from routing_transformer.tools.probes import report
from routing_transformer.tools.probes import run as run_lib
from routing_transformer.tools.probes import scoring

PROBLEM = "pg19_length2k"
LENGTHS = (256, 512, 1024, 2048)
INPUTS = 24  # per model and N: 240 targets; 3 models x 4 N x 24 = 288 passes, about 1 min on 2 AVX2 cores


def probe_specs(specs, books_dir, data_dir, out_dir, local_set, lengths=LENGTHS, inputs=INPUTS,
                seed=0, batch_size=4, reading="lines"):
  """Probes the models of `specs` ([run.ModelSpec]) on the test books, far = last seen beyond the
  receptive field of hparams set `local_set`; writes out_dir (JSON, tables, PNGs); returns
  (result, far threshold, written paths)."""
  from routing_transformer.tools import score  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import usr_dirs  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  usr_dirs.register_project()
  encoder = score.load_encoder(None, PROBLEM, data_dir)
  books, _ = data.load_books(books_dir, "test", encoder,
                             cache_dir=os.path.join(out_dir, "encoded"), reading=reading)
  threshold = scoring.local_receptive_field(registry.hparams(local_set))
  result = probe.probe(specs, books, encoder, lengths, max(lengths), out_dir,
                       num_targets=inputs * 10, seed=seed, far_threshold=threshold,
                       scale=probe.word_scale(books, "exact"), batch_size=batch_size,
                       stream=None, reading=reading)
  return result, threshold, report.write(result, out_dir)


def run(output, books_dir, data_dir, routing=("routing", "pg19_local_cluster_tiny2k"),
        local=("local", "pg19_local_tiny2k"), lengths=LENGTHS, inputs=INPUTS, seed=0,
        batch_size=4, log=None, reading="lines"):
  """Probes <output>/<routing[0]>, its derived local model and <output>/<local[0]>; returns
  (markdown, result)."""
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  started = time.time()
  name, hparams_set = routing
  specs = [run_lib.ModelSpec(name, os.path.join(output, name), hparams_set),
           run_lib.ModelSpec(name + "-as-local", os.path.join(output, name), hparams_set,
                             "", True),
           run_lib.ModelSpec(local[0], os.path.join(output, local[0]), local[1])]
  out_dir = os.path.join(output, "probes")
  result, threshold, paths = probe_specs(specs, books_dir, data_dir, out_dir, local[1], lengths,
                                         inputs, seed, batch_size, reading)
  local_hparams = registry.hparams(local[1])
  seconds = time.time() - started
  passes = len(specs) * len(lengths) * result["protocol"]["inputs"]
  md = ("\nLong-range context (Sun et al. 2021 probes, `python -m routing_transformer.tools.probes`): "
        "the 3 test books, %d inputs per prefix length N, 10 targets each at [-50:-40] of the "
        "input (the same targets for every N and model); word-level perplexity = exp(%.3f "
        "subwords per word of these books x mean NLL) [95%% bootstrap interval over inputs]; "
        "far / near / never: the target last seen in its %d-token input more than %d tokens back "
        "(the local model's receptive field: %d layers x (block %d + flange %d - 1)) / within "
        "that / not at all, fixed for every N; %s-as-local = "
        "the routing checkpoint with its routing heads evaluated as local heads. %d passes in "
        "%.0f s. Plots: %s.\n" % (
            result["protocol"]["inputs"], result["protocol"]["word_scale"], max(lengths),
            threshold,
            local_hparams.num_decoder_layers,
            local_hparams.query_shape[0], local_hparams.memory_flange[0], name, passes, seconds,
            ", ".join(os.path.relpath(p, output) for p in paths if p.endswith(".png"))))
  md += report.markdown(result, ["all", "far", "near", "never"])
  if log:
    log("probes: %d passes in %.0f s (%s)" % (passes, seconds, out_dir))
  return md, result


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  output = argv[0] if argv else "demo_output"
  md, _ = run(output, os.path.join(output, "books"), os.path.join(output, "data"))
  print(md)


if __name__ == "__main__":
  main()
