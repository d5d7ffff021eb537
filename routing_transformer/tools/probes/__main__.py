"""python -m routing_transformer.tools.probes: the long-range context probes of Sun et al. (2021).

The token-level probe by default; --probes=token,perturb,copy,suffix adds perturbations of the
first m tokens, sequence copy and suffix identification (docs/probes.md).

  python -m routing_transformer.tools.probes --books_dir=BOOKS --split=validation \\
      --checkpoint=rt=CKPT_DIR --hparams_set=pg19_local_cluster8k --as_local=rt \\
      --vocab=vocab.pg19_length8k.32768.subwords --output=probe_out
  python -m routing_transformer.tools.probes --merge=a/probes.json,b/probes.json --output=both

Writes <output>/probes.{json,md}, <output>/probes_categories.png and probes_end_of_input.png
(and probes_perturbations.png, probes_copy.png, probes_suffix.png for those probes); per-(model,
N) and per-(model, probe) shards under <output>/shards make a rerun skip what is done.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from routing_transformer.tools.probes.errors import ProbeError  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m routing_transformer.tools.probes",
                              description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", action="append", default=[],
                 help="LABEL=CHECKPOINT (repeatable): a t2t-trainer output_dir or checkpoint "
                      "prefix, ours or the original release's")
  p.add_argument("--hparams_set", action="append", default=[],
                 help="SET for every model, or LABEL=SET (repeatable)")
  p.add_argument("--hparams", action="append", default=[],
                 help="LABEL=k=v,... overrides of one model's set (repeatable)")
  p.add_argument("--as_local", action="append", default=[],
                 help="LABEL (repeatable): also probe the derived local model of LABEL (every "
                      "routing head evaluated as a local head, same weights), as LABEL-as-local")
  p.add_argument("--hparams_json", default="check", choices=["check", "use", "ignore"])
  p.add_argument("--vocab", default=None, help="the models' subword vocab file")
  p.add_argument("--problem", default=None, help="instead of --vocab: a problem's encoder")
  p.add_argument("--data_dir", default=None, help="data_dir of --problem")
  p.add_argument("--t2t_usr_dir", default=None, help="comma-separated user directories")
  p.add_argument("--books_dir", default=None, help="PG-19 layout root (metadata.csv, "
                 "train/ validation/ test/ of <id>.txt)")
  p.add_argument("--split", default="validation", help="validation (default), test or train")
  p.add_argument("--exclude", action="append", default=[],
                 help="book id or title to leave out (repeatable)")
  p.add_argument("--no_default_exclude", action="store_true",
                 help="keep 'The Canterbury Tales and Other Poems' (id 2383) in PG-19 validation "
                      "(by default it is left out, matched by id or title, as Sun et al. did)")
  p.add_argument("--reading", default="lines", choices=["lines", "whole_text"],
                 help="how books become ids (problems.pg19_reading): lines = each line stripped "
                      "and encoded, joined without newlines (the original release's; default), "
                      "whole_text = the text with its newlines (vocabularies built that way)")
  p.add_argument("--max_books", type=int, default=None)
  p.add_argument("--lengths", default=None,
                 help="prefix lengths N, comma-separated (default: 512,1024,2048,3072,...,8192 "
                      "up to the model's length)")
  p.add_argument("--span", default="-50:-40",
                 help="target offsets from the input's end, START:END (write --span=-50:-40)")
  p.add_argument("--targets", type=int, default=220000, help="targets in all (paper: 220K)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--far_threshold", type=int, default=2048,
                 help="'far' = last seen more than this many tokens back")
  p.add_argument("--frequent_fraction", type=float, default=0.1,
                 help="top fraction of subword types (by count in the probed books) = frequent")
  p.add_argument("--word_scale", default="1.248",
                 help="perplexity = exp(scale x mean NLL): a number, or 'exact' (tokens / words "
                      "of the probed books)")
  p.add_argument("--profile", type=int, default=64, help="positions from the end whose mean "
                 "loss is reported")
  p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (0: none)")
  p.add_argument("--batch_size", type=int, default=1, help="inputs per forward pass")
  p.add_argument("--accelerator_flops", type=float, default=1e14,
                 help="effective FLOP/s of one accelerator for the full-protocol estimate")
  p.add_argument("--probes", default="token",
                 help="comma-separated, some of token,perturb,copy,suffix (default token)")
  p.add_argument("--perturb_m", default=None,
                 help="tokens perturbed from the input's start, comma-separated (default "
                      "512,1024,...,7680 up to the first target)")
  p.add_argument("--perturb_runs", type=int, default=5,
                 help="runs of the random perturbations (paper: 5)")
  p.add_argument("--perturb_kinds", default="shuffle,replace,drop,drop_control",
                 help="some of shuffle,replace,drop,drop_control")
  p.add_argument("--drop_rule", default="next", choices=["next", "any"],
                 help="drop the prefix tokens whose next occurrence is a target (next, the "
                      "paper's) or that equal any target (any)")
  p.add_argument("--copy_distances", default=None,
                 help="copy distances d, comma-separated (default 64,128,...,4096 and the "
                      "first target's position)")
  p.add_argument("--copy_context", type=int, default=0,
                 help="tokens before the first target copied with the targets")
  p.add_argument("--suffix_prefixes", default=None,
                 help="prefix lengths P, comma-separated (default 200,512,1024,2048,4096,8064 "
                      "capped at L - suffix length)")
  p.add_argument("--suffix_examples", type=int, default=1000, help="suffix examples")
  p.add_argument("--suffix_length", type=int, default=128, help="tokens per candidate (128)")
  p.add_argument("--suffix_negatives", type=int, default=5, help="negatives per example (5)")
  p.add_argument("--merge", default=None,
                 help="comma-separated probes.json files of the same protocol: report them "
                      "together (no scoring)")
  p.add_argument("--output", required=True, help="output folder")
  return p.parse_args(argv)


def keyed(values, labels, what):
  """{label: value} from 'LABEL=value' entries, or one bare value for every label."""
  out = {}
  for v in values:
    label, sep, rest = v.partition("=")
    if sep and label in labels:
      out[label] = rest
    elif len(values) == 1 and not (sep and label in labels):
      return {l: v for l in labels}
    else:
      raise ProbeError("--%s=%s: write LABEL=VALUE with LABEL one of %s" % (
          what, v, ", ".join(labels)))
  return out


def specs_of(args):
  """[run.ModelSpec] of the --checkpoint, --hparams_set, --hparams and --as_local flags."""
  from routing_transformer.tools.probes import run  # pylint: disable=g-import-not-at-top
  if not args.checkpoint:
    raise ProbeError("give at least one --checkpoint=LABEL=PATH (or --merge)")
  models = []
  for m in args.checkpoint:
    label, sep, path = m.partition("=")
    if not sep or not label or not path:
      raise ProbeError("--checkpoint=%s: write LABEL=CHECKPOINT, e.g. --checkpoint=rt=/path/to/run" % m)
    models.append((label, path))
  labels = [l for l, _ in models]
  sets = keyed(args.hparams_set, labels, "hparams_set")
  overrides = {}
  for v in args.hparams:
    label, sep, rest = v.partition("=")
    if not sep or label not in labels:
      raise ProbeError("--hparams=%s: write LABEL=k=v,... with LABEL one of %s"
                       % (v, ", ".join(labels)))
    overrides[label] = rest
  for label in args.as_local:
    if label not in labels:
      raise ProbeError("--as_local=%s: no --checkpoint with that label (%s)" % (label,
                                                                           ", ".join(labels)))
  specs = []
  for label, path in models:
    specs.append(run.ModelSpec(label, path, sets.get(label), overrides.get(label, ""), False))
    if label in args.as_local:
      specs.append(run.ModelSpec(label + "-as-local", path, sets.get(label),
                                 overrides.get(label, ""), True))
  return specs


def options_of(args):
  """runners.plan's keyword arguments from the flags."""
  return dict(perturb_m=args.perturb_m, perturb_runs=args.perturb_runs,
              perturb_kinds=args.perturb_kinds, drop_rule=args.drop_rule,
              copy_distances=args.copy_distances, copy_context=args.copy_context,
              suffix_prefixes=args.suffix_prefixes, suffix_examples=args.suffix_examples,
              suffix_length=args.suffix_length, suffix_negatives=args.suffix_negatives)


def model_length(spec, args):
  from routing_transformer.tools import checkpoints  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import usr_dirs  # pylint: disable=g-import-not-at-top
  try:
    usr_dirs.import_usr_dirs(args.t2t_usr_dir)
    hp = checkpoints.resolve_hparams(checkpoints.find_checkpoint(spec.checkpoint),
                                     spec.hparams_set, spec.hparams, args.hparams_json,
                                     args.t2t_usr_dir)
  except (checkpoints.CheckpointError, usr_dirs.UsrDirError) as e:
    raise ProbeError("--checkpoint=%s=%s: %s" % (spec.label, spec.checkpoint, e))
  if hp is None:
    raise ProbeError("--checkpoint=%s: pass --hparams_set (the set it was trained with)" % spec.label)
  return hp.max_target_length or hp.max_length, hp


def main(argv=None):
  args = parse_args(argv)
  try:
    from routing_transformer.tools.probes import report  # pylint: disable=g-import-not-at-top
    if args.merge:
      results = []
      for path in args.merge.split(","):
        if not os.path.exists(path):
          raise ProbeError("--merge: %s not found" % path)
        with open(path) as f:
          results.append(json.load(f))
      paths = report.write(report.merge(results), args.output)
      print("\n".join(paths))
      return 0
    if not args.books_dir:
      raise ProbeError("pass --books_dir (a PG-19 layout root) or --merge")
    from routing_transformer.tools import score  # pylint: disable=g-import-not-at-top
    from routing_transformer.tools.probes import data  # pylint: disable=g-import-not-at-top
    from routing_transformer.tools.probes import probe  # pylint: disable=g-import-not-at-top
    from routing_transformer.tools.probes import sampling  # pylint: disable=g-import-not-at-top
    from routing_transformer.tools.probes import scoring  # pylint: disable=g-import-not-at-top
    from routing_transformer.tools.probes import runners  # pylint: disable=g-import-not-at-top
    specs = specs_of(args)
    runners.parse_probes(args.probes)
    span = sampling.parse_span(args.span)
    found = [model_length(s, args) for s in specs]
    length = min(l for l, _ in found)
    lengths = ([int(x) for x in args.lengths.split(",") if x.strip()] if args.lengths
               else probe.default_lengths(length))
    probe.check_lengths(lengths, length, span, args.profile)
    try:
      encoder = score.load_encoder(args.vocab, args.problem, args.data_dir)
    except score.ScorerError as e:
      raise ProbeError(str(e))
    books, excluded = data.load_books(args.books_dir, args.split, encoder, args.exclude,
                                      not args.no_default_exclude,
                                      os.path.join(args.output, "encoded"), args.max_books,
                                      args.reading)
    sys.stderr.write("[probes] %d books of %s (%d tokens), excluded: %s\n" % (
        len(books), args.split, sum(len(b.ids) for b in books),
        ", ".join("%s %s" % e for e in excluded) or "none"))
    result = probe.probe(specs, books, encoder, lengths, length, args.output, span=span,
                         num_targets=args.targets, seed=args.seed,
                         far_threshold=args.far_threshold,
                         frequent_fraction=args.frequent_fraction,
                         scale=probe.word_scale(books, args.word_scale), profile=args.profile,
                         bootstrap=args.bootstrap, batch_size=args.batch_size,
                         t2t_usr_dir=args.t2t_usr_dir, vocab=encoder, probes=args.probes,
                         options=options_of(args), reading=args.reading)
    speed = [v["input_tokens_per_s"] for m in result["models"].values()
             for v in m["speed"].values()] or [None]
    from hparams import sets  # pylint: disable=g-import-not-at-top
    result["estimate"] = {
        # the vocabulary file's name says 32,768 subwords, public code 98,302 (not checked)
        "released_model_full_protocol": {
            "vocab_%d" % v: probe.paper_estimate(sets.pg19_local_cluster8k(), v,
                                                 accelerator_flops=args.accelerator_flops)
            for v in (32768, 98302)},
        "this_run": {"median_input_tokens_per_s": sorted(speed)[len(speed) // 2],
                     "flops_per_token": {
                         s.label: scoring.forward_flops_per_token(hp, encoder.vocab_size, l)
                         for s, (l, hp) in zip(specs, found)}}}
    result["protocol"]["excluded"] = [list(e) for e in excluded]
    result["protocol"]["split"] = args.split
    paths = report.write(result, args.output)
  except ProbeError as e:
    sys.exit("error: %s" % e)
  print(report.markdown(result))
  print("\n".join(paths))
  return 0


if __name__ == "__main__":
  main()
