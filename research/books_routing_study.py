"""Back to the books (research/notes/routing_learning.md): the demo's routing model with the
switches of the
look-up study, against the demo's routing and local runs, on the same data and steps.

    python research/books_routing_study.py [--demo_output demo_output] [--steps 700]
        [--models switches,routing_only] [--inputs 96] [--output research/results/books_routing]

Needs a finished `make demo` (its books, records and its `routing` and `local` runs, trained for
--steps). Trains, with `make demo`'s recipe (t2t-trainer, the same steps, evaluations and data):
  switches      `pg19_routing_switches_tiny2k`: the demo's layout + routing_logit_scale=rsqrt_depth
                + routing_exclude_self;
  routing_only  `pg19_routing_only_tiny2k`: four routing heads in both layers (16 x 128), no
                local heads, both switches (the layout of `routing_only_transformer_tiny1k`);
evaluates each on the test books (`routing_transformer.tools.evaluate`), tabulates where its heads
attend (`routing_transformer.tools.analysis`), then runs the Sun et al. probes on every model
(the demo's two, the new ones, and the as-local twin of each model that has local heads) with
--inputs inputs per prefix length, far = last seen beyond the local model's receptive field.
Writes <output>/summary.{md,json}, <output>/probes/ and the runs under <output>/<name>.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import demo  # pylint: disable=g-import-not-at-top,wrong-import-position
import t2t_runs  # pylint: disable=g-import-not-at-top,wrong-import-position
from t2t_runs import eval_metrics, log, python_module, quiet_tensorflow, train, train_speed  # pylint: disable=g-import-not-at-top,wrong-import-position

quiet_tensorflow()
# The study's sets are registered by research's user directory (it imports the project's first):
# every t2t-* run of t2t_runs and every evaluation takes it as --t2t_usr_dir.
USR_DIR = os.path.join(ROOT, "research", "usr_dir")
t2t_runs.USR_DIR = USR_DIR
PROBLEM = demo.PROBLEM
DEMO = dict(demo.MODELS)  # the runs of `make demo`
MODELS = {"switches": "pg19_routing_switches_tiny2k", "routing_only": "pg19_routing_only_tiny2k"}


def demo_run(demo_output, name, steps):
  """The run directory of `make demo`'s model `name`, checked to have trained `steps` steps."""
  run_dir = os.path.join(demo_output, name)
  step = eval_metrics(run_dir)["step"] if os.path.isdir(run_dir) else -1
  if step != steps:
    sys.exit("books_routing_study: %s has no %d-step run of `make demo` (found: %s); run `make "
             "demo` first (or pass --demo_output)" % (run_dir, steps,
                                                     "none" if step < 0 else "%d steps" % step))
  return run_dir


def test_report(run_dir, hparams_set, data_dir):
  """`make demo`'s test-book evaluation (scripts/demo.py `evaluate_test`), read back when done."""
  out = run_dir + ".test.json"
  if not os.path.exists(out):
    python_module("routing_transformer.tools.evaluate", [
        "--problem=" + PROBLEM, "--data_dir=" + data_dir, "--hparams_set=" + hparams_set,
        "--checkpoint=" + run_dir, "--split=test", "--batch_size=4", "--output_json=" + out,
        "--t2t_usr_dir=" + USR_DIR], run_dir + ".evaluate.log")
  with open(out) as f:
    return json.load(f)


def has_as_local_twin(hparams_set):
  """Whether the set has routing and local heads (the probes' as-local twin evaluates the
  routing heads as local heads with the local heads' relative tables)."""
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  hp = registry.hparams(hparams_set)
  return hp.sparsity_cluster_num_heads > 0 and hp.local_num_heads > 0


def run_probes(runs, books_dir, data_dir, out_dir, inputs, seed=0):
  """The probes on every (name, run_dir, hparams_set) and the as-local twin of each model with
  both head kinds (`probes.demo.probe_specs`); returns (result, markdown)."""
  from routing_transformer.tools.probes import demo as probes_demo  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools.probes import report  # pylint: disable=g-import-not-at-top
  from routing_transformer.tools.probes import run as run_lib  # pylint: disable=g-import-not-at-top
  specs = []
  for name, run_dir, hparams_set in runs:
    specs.append(run_lib.ModelSpec(name, run_dir, hparams_set))
    if has_as_local_twin(hparams_set):
      specs.append(run_lib.ModelSpec(name + "-as-local", run_dir, hparams_set, "", True))
  result, threshold, _ = probes_demo.probe_specs(specs, books_dir, data_dir, out_dir,
                                                 DEMO["local"], inputs=inputs, seed=seed)
  md = ("Probes: the 3 test books, %d inputs per N, 10 targets each at [-50:-40]; far = last "
        "seen more than %d tokens back (the local model's receptive field); word-level "
        "perplexity [95%% bootstrap interval over inputs].\n\n" % (result["protocol"]["inputs"],
                                                                  threshold))
  return result, md + report.markdown(result, ["all", "far", "near", "never"])


def head_focus(run_dir, out_dir, data_dir):
  """The analysis tool's table of where the heads of a run attend (markdown)."""
  from routing_transformer.tools import analysis  # pylint: disable=g-import-not-at-top
  _, markdown, _ = analysis.analyse(run_dir, out_dir, problem=PROBLEM, data_dir=data_dir,
                                    num_sequences=2)
  return markdown


def table(results):
  lines = ["| model | hparams set | steps | eval loss (validation) | test subword ppl | "
           "test word ppl | steps/s |", "|---|---|---|---|---|---|---|"]
  for name, m in results.items():
    t = m["test"]
    lines.append("| %s | `%s` | %d | %.4f | %.1f | %.1f | %.2f |" % (
        name, m["hparams_set"], m["step"], m.get("loss", float("nan")), t["token_perplexity"],
        t["word_perplexity"], m["steps_per_sec"]))
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--demo_output", default=os.path.join(ROOT, "demo_output"))
  parser.add_argument("--steps", type=int, default=700, help="as `make demo`")
  parser.add_argument("--evaluations", type=int, default=4, help="as `make demo`")
  parser.add_argument("--eval_steps", type=int, default=30, help="as `make demo`")
  parser.add_argument("--models", default=",".join(MODELS), help="of: " + ", ".join(MODELS))
  parser.add_argument("--inputs", type=int, default=96, help="probe inputs per prefix length")
  parser.add_argument("--output", default=os.path.join(ROOT, "research", "results",
                                                       "books_routing"))
  args = parser.parse_args()
  names = [m for m in args.models.split(",") if m]
  unknown = [m for m in names if m not in MODELS]
  if unknown:
    sys.exit("books_routing_study: unknown --models %s; choose from %s" % (
        ",".join(unknown), ", ".join(MODELS)))
  from routing_transformer.t2t import usr_dirs  # pylint: disable=g-import-not-at-top
  usr_dirs.import_usr_dirs(USR_DIR)
  started = time.time()
  os.environ["PG19_READING"] = "lines"  # as `make demo`
  data_dir = os.path.join(args.demo_output, "data")
  books_dir = os.path.join(args.demo_output, "books")
  runs = [(name, demo_run(args.demo_output, name, args.steps), hp) for name, hp in DEMO.items()]
  os.makedirs(args.output, exist_ok=True)
  results, focus = {}, {}
  for name in names:
    hparams_set, run_dir = MODELS[name], os.path.join(args.output, name)
    if not (os.path.isdir(run_dir) and eval_metrics(run_dir)["step"] == args.steps):
      log("t2t-trainer --hparams_set=%s: %d steps as `make demo` (log: %s.log)" % (
          hparams_set, args.steps, run_dir))
      train(run_dir, PROBLEM, hparams_set, data_dir, args.steps, args.eval_steps,
            eval_every=max(args.steps // max(args.evaluations, 1), 100))
    runs.append((name, run_dir, hparams_set))
    focus[name] = head_focus(run_dir, os.path.join(args.output, "analysis", name), data_dir)
  for name, run_dir, hparams_set in runs:
    log("routing_transformer.tools.evaluate --split=test (%s)" % name)
    metrics = eval_metrics(run_dir)
    metrics.update(hparams_set=hparams_set, steps_per_sec=train_speed(run_dir),
                   test=test_report(run_dir, hparams_set, data_dir))
    results[name] = metrics
  log("probes on %s (%d inputs per N)" % (", ".join(r[0] for r in runs), args.inputs))
  result, probes_md = run_probes(runs, books_dir, data_dir, os.path.join(args.output, "probes"),
                                 args.inputs)
  md = (table(results) + "\n\nSame books, records, steps and batch for every model (`make demo`'s "
        "recipe); `routing` and `local` are the runs of `make demo` in %s.\n\n" % args.demo_output
        + "".join("Where the heads of `%s` attend:\n%s\n\n" % (n, f) for n, f in focus.items())
        + probes_md)
  with open(os.path.join(args.output, "summary.md"), "w", encoding="utf-8") as f:
    f.write(md)
  with open(os.path.join(args.output, "summary.json"), "w") as f:
    json.dump({"results": results, "probes": result["protocol"], "date": time.strftime(
        "%Y-%m-%d %H:%M UTC", time.gmtime())}, f, indent=1, default=str)
  print(md)
  log("done in %.0f s; outputs under %s" % (time.time() - started, args.output))


if __name__ == "__main__":
  main()
