"""scripts/progress.py: the live status line of a t2t-trainer run, read from log lines as
t2t-trainer writes them (each twice: Python logging, then absl). No TensorFlow."""
import io
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
import progress  # pylint: disable=g-import-not-at-top,wrong-import-position

LOG = """INFO:tensorflow:Calling model_fn.
I1125 10:36:13.576290 140293836086144 estimator.py:1175] Calling model_fn.
WARNING:tensorflow:From /x/tf_record.py:27: tf_record_iterator is deprecated
INFO:tensorflow:loss = 8.321955, step = 1
I1125 10:37:27.713404 140293836086144 basic_session_run_hooks.py:265] loss = 8.321955, step = 1
INFO:tensorflow:global_step/sec: 1.25
I1125 10:37:35.713404 140293836086144 basic_session_run_hooks.py:260] global_step/sec: 1.25
INFO:tensorflow:loss = 7.5, step = 11 (8.000 sec)
I1125 10:37:35.713404 1402938 basic_session_run_hooks.py:263] loss = 7.5, step = 11 (8.000 sec)
"""
EVAL = """INFO:tensorflow:Saving checkpoints for 20 into /tmp/run/model.ckpt.
INFO:tensorflow:Starting evaluation at 2026-11-25T10:38:04
I1125 10:38:04.895496 140293836086144 evaluation.py:250] Starting evaluation at 2026-11-25T10:38:04
INFO:tensorflow:Evaluation [3/30]
I1125 10:38:10.950402 140293836086144 evaluation.py:163] Evaluation [3/30]
"""
EVAL_DONE = ("INFO:tensorflow:Saving dict for global step 20: global_step = 20, loss = 7.780179, "
             "metrics-pg19_length2k/targets/accuracy = 0.04\n")


def test_losses_and_speed_are_read_once_per_step():
  assert progress.train_losses(LOG + EVAL + EVAL_DONE) == [(1, 8.321955), (11, 7.5)]
  state = progress.TrainerState()
  assert state.feed(LOG) and (state.step, state.loss, state.speed) == (11, 7.5, 1.25)
  assert not state.feed(LOG.splitlines(True)[-1])  # the absl copy of the last line: nothing new


def test_the_speed_logged_across_an_evaluation_is_not_shown():
  """The first global_step/sec after an evaluation (both copies) spans the evaluation: the
  status keeps the last training speed until the next loss line, then takes new ones."""
  state = progress.TrainerState()
  state.feed(LOG + EVAL + EVAL_DONE)
  state.feed("INFO:tensorflow:global_step/sec: 0.44\n"
             "I1125 10:39:00.1 1 basic_session_run_hooks.py:260] global_step/sec: 0.44\n")
  assert state.speed == 1.25
  state.feed("INFO:tensorflow:loss = 7.1, step = 31 (20.000 sec)\n"
             "INFO:tensorflow:global_step/sec: 1.5\n")
  assert (state.step, state.speed) == (31, 1.5)


def test_a_line_cut_between_reads_is_read_whole():
  state = progress.TrainerState()
  cut = LOG.index("7.5, step = 11") + 3
  state.feed(LOG[:cut])
  assert state.loss == 8.321955  # "loss = 7.5" not read from a half line
  state.feed(LOG[cut:])
  assert (state.step, state.loss) == (11, 7.5)


def test_status_line_training_evaluating_and_final():
  state = progress.TrainerState()
  assert progress.status_line("routing", state, 700, 12) == (
      "routing: building the model [0:12]")
  state.feed("I1125 10:36:55.355715 1402 monitored_session.py:240] Graph was finalized.\n"
             "INFO:tensorflow:Saving checkpoints for 0 into /tmp/run/model.ckpt.\n")
  assert progress.status_line("routing", state, 700, 40) == (
      "routing: running the first step [0:40]")
  state.feed(LOG)
  # (700 - 11) / 1.25 = 551.2 s
  assert progress.status_line("routing", state, 700, 75) == (
      "routing: step 11/700 (1%), loss 7.500, 1.25 steps/s, ETA 9:11 [1:15]")
  state.feed(EVAL)
  assert progress.status_line("routing", state, 700, 90) == (
      "routing: evaluating 3/30 at step 20 [1:30]")
  state.feed(EVAL_DONE + EVAL_DONE.replace("INFO:tensorflow:", "I1125 10:38:16 estimator.py] "))
  assert state.evaluation is None and state.evaluated == {20}
  assert progress.final_line("routing", state, 700, 3725) == (
      "routing: 20/700 steps at 1.25 steps/s, last loss 7.500, 1 evaluation [1:02:05]")
  assert progress.status_line("t2t-datagen", state, None, 40) == "t2t-datagen: running [0:40]"
  state.feed("I1125 11:01:57.504547 1397 shards.py:79] pg19_length2k train: shard 10/10, "
             "36/36 books, 1269579 tokens, 198793 tokens/s\n")
  assert progress.status_line("t2t-datagen", state, None, 41) == (
      "t2t-datagen: running, pg19_length2k train: shard 10/10, 36/36 books, 1269579 tokens, "
      "198793 tokens/s [0:41]")


class FakeClock(object):
  def __init__(self):
    self.t = 1000.0

  def __call__(self):
    return self.t


def test_plain_output_prints_every_interval_and_a_final_line():
  clock, out = FakeClock(), io.StringIO()
  watch = progress.Watch("local", 100, stream=out, plain_every=10, now=clock)
  for second in range(25):
    clock.t = 1000.0 + second
    if second == 12:
      watch.feed(LOG)
    watch.tick()
  watch.finish()
  lines = out.getvalue().splitlines()
  assert lines == ["local: building the model [0:10]",
                   "local: step 11/100 (11%), loss 7.500, 1.25 steps/s, ETA 1:11 [0:20]",
                   "local: 11/100 steps at 1.25 steps/s, last loss 7.500, 0 evaluations [0:24]"]
  assert "\r" not in out.getvalue()


def test_terminal_output_rewrites_one_line():
  class Terminal(io.StringIO):
    def isatty(self):
      return True
  clock, out = FakeClock(), Terminal()
  watch = progress.Watch("routing", 100, stream=out, now=clock)
  watch.tick()
  watch.feed(LOG)
  clock.t += 5
  watch.tick()
  watch.finish()
  text = out.getvalue()
  assert text.count("\n") == 1 and text.endswith("\n")
  shown = [part.rstrip() for part in text.rstrip("\n").split("\r")[1:]]
  assert shown == ["routing: building the model [0:00]",
                   "routing: step 11/100 (11%), loss 7.500, 1.25 steps/s, ETA 1:11 [0:05]",
                   "routing: 11/100 steps at 1.25 steps/s, last loss 7.500, 0 evaluations [0:05]"]
  # a shorter line blanks out the rest of a longer one
  assert len(text.split("\r")[3].rstrip("\n")) >= len(shown[1])


def test_clock():
  assert [progress.clock(s) for s in (0, 59.6, 65, 3600, 3725)] == [
      "0:00", "1:00", "1:05", "1:00:00", "1:02:05"]


def test_run_logged_follows_the_log_of_a_running_binary(tmp_path, monkeypatch):
  import t2t_runs  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(t2t_runs, "POLL_SECONDS", 0.02)
  fake = tmp_path / "fake_trainer.py"  # writes the sample log in two parts, a moment apart
  fake.write_text("import sys, time\nlog = open(sys.argv[1]).read()\n"
                  "half = log.index('INFO:tensorflow:global')\n"
                  "sys.stderr.write(log[:half]); sys.stderr.flush(); time.sleep(0.3)\n"
                  "sys.stdout.write(log[half:]); sys.stdout.flush(); time.sleep(0.3)\n"
                  "sys.exit(int(sys.argv[2]))\n")
  sample = tmp_path / "sample.log"
  sample.write_text(LOG)
  out, logfile = io.StringIO(), str(tmp_path / "run.log")
  watch = progress.Watch("routing", 100, stream=out, plain_every=0.1)
  t2t_runs.run_logged([sys.executable, str(fake), str(sample), "0"], logfile, "t2t-trainer",
                      watch)
  with open(logfile) as f:
    assert f.read() == LOG  # the whole log stays in the file
  lines = out.getvalue().splitlines()
  assert any(l.startswith("routing: step 1/100 (1%), loss 8.322 [") for l in lines)
  assert lines[-1].startswith("routing: 11/100 steps at 1.25 steps/s, last loss 7.500, 0 evalu")
  with pytest.raises(SystemExit, match=r"(?s)t2t-trainer failed \(exit 3\); last lines of .*"
                                       r"loss = 7.5, step = 11"):
    t2t_runs.run_logged([sys.executable, str(fake), str(sample), "3"], logfile, "t2t-trainer",
                        progress.Watch("routing", 100, stream=io.StringIO()))
