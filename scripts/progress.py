"""Live progress of a stock T2T binary, read from its log (no TensorFlow import).

t2t-trainer logs `loss = 4.81, step = 120 (6.5 sec)` and `global_step/sec: 1.53` every
--log_step_count_steps steps and `Evaluation [12/30]` while it evaluates (each line twice: through
Python logging and through absl). `TrainerState.feed` reads such lines; `status_line` turns the
state into one line: step / total, loss, steps/s, ETA, or the evaluation's progress.

    watch = Watch("routing", total_steps=700)      # prints to sys.stdout
    watch.feed(new_log_text); watch.tick()          # every ~second while the binary runs
    watch.finish()                                  # `routing: 700/700 steps at 1.54 steps/s ...`
"""
import math
import re
import sys
import time

LOSS = re.compile(r"\bloss = ([-+0-9.eE]+|nan|inf), step = (\d+)")
SPEED = re.compile(r"global_step/sec: ([-+0-9.eE]+|nan|inf)")
EVALUATION = re.compile(r"Evaluation \[(\d+)/(\d+)\]")
EVAL_START = "Starting evaluation at"
EVAL_DONE = re.compile(r"Saving dict for global step (\d+)")
CHECKPOINT = re.compile(r"Saving checkpoints for (\d+) into")  # the step evaluations read
SESSION_READY = "Graph was finalized"  # the training graph is built; the first steps follow
SHARD_NOTE = re.compile(r"(?:INFO:tensorflow:|\] )(.+: shard \d+/\d+, .*)$")  # datagen progress


def train_losses(text):
  """[(step, loss)] of every `loss = ..., step = ...` line, each step once, in log order."""
  points, seen = [], set()
  for match in LOSS.finditer(text):
    step = int(match.group(2))
    if step not in seen:
      seen.add(step)
      points.append((step, float(match.group(1))))
  return points


class TrainerState(object):
  """What the log of one t2t-trainer run has said so far."""

  def __init__(self):
    self.step = None  # last logged step
    self.loss = None  # last logged (single-batch) training loss
    self.speed = None  # last global_step/sec
    self.evaluation = None  # (batches done, batches) while evaluating, else None
    self.evaluated = set()  # steps evaluated (Estimator may evaluate the last one twice)
    self.session_ready = False  # the training graph is built
    self.note = None  # the last datagen progress line (problems/shards.py)
    self._after_eval = False  # global_step/sec until the next loss spans an evaluation
    self._partial = ""

  def feed(self, text):
    """Reads the complete lines of `text` (a chunk of the log; a cut-off last line is kept for
    the next chunk). Returns True when something changed."""
    lines = (self._partial + text).split("\n")
    self._partial = lines.pop()
    changed = False
    for line in lines:
      changed |= self.read_line(line)
    return changed

  def read_line(self, line):
    before = (self.step, self.loss, self.speed, self.evaluation, len(self.evaluated),
              self.session_ready, self.note)
    match = LOSS.search(line)
    if match:
      self.loss, self.step = float(match.group(1)), int(match.group(2))
      self.evaluation = None
      self._after_eval = False
    match = CHECKPOINT.search(line)
    if match:
      self.step = max(self.step or 0, int(match.group(1)))
    match = SPEED.search(line)
    if match:
      if not self._after_eval:
        self.speed = float(match.group(1))
    if EVAL_START in line and self.evaluation is None:
      self.evaluation = (0, None)
    match = EVALUATION.search(line)
    if match:
      self.evaluation = (int(match.group(1)), int(match.group(2)))
    match = EVAL_DONE.search(line)
    if match:
      self.evaluation = None
      self.evaluated.add(int(match.group(1)))
      self._after_eval = True
    if SESSION_READY in line:
      self.session_ready = True
    match = SHARD_NOTE.search(line)
    if match:
      self.note = match.group(1)
    return before != (self.step, self.loss, self.speed, self.evaluation, len(self.evaluated),
                      self.session_ready, self.note)


def clock(seconds):
  """1:05, 12:40, 1:02:03."""
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  text = "%d:%02d" % divmod(rest, 60)
  return "%d:%s" % (hours, text.zfill(5)) if hours else text


def status_line(name, state, total_steps, elapsed):
  """One line: `routing: step 340/700 (48%), loss 5.12, 1.52 steps/s, ETA 3:57 [2:41]`; for a
  binary without steps (total_steps None) `t2t-datagen: running [0:40]`."""
  if total_steps is None:
    what = "running" + (", " + state.note if state.note else "")
  elif state.evaluation is not None:
    done, batches = state.evaluation
    what = "evaluating%s at step %s" % (
        " %d/%d" % (done, batches) if batches else "", state.step)
  elif state.loss is None:  # (a checkpoint of step 0 is saved before the first step)
    what = "running the first step" if state.session_ready else "building the model"
  else:
    what = "step %d/%d (%d%%), loss %.3f" % (
        state.step, total_steps, 100 * state.step // max(total_steps, 1), state.loss)
    if state.speed and state.speed > 0 and math.isfinite(state.speed):
      what += ", %.2f steps/s, ETA %s" % (
          state.speed, clock(max(total_steps - state.step, 0) / state.speed))
  return "%s: %s [%s]" % (name, what, clock(elapsed))


def final_line(name, state, total_steps, elapsed):
  """`routing: 700/700 steps at 1.54 steps/s, last loss 4.912, 4 evaluations [8:21]` (the
  last logged speed; the time includes building the model and the evaluations)."""
  if total_steps is None:
    return "%s: done [%s]" % (name, clock(elapsed))
  text = "%s: %d/%d steps" % (name, state.step or 0, total_steps)
  if state.speed:
    text += " at %.2f steps/s" % state.speed
  if state.loss is not None:
    text += ", last loss %.3f" % state.loss
  count = len(state.evaluated)
  return text + ", %d evaluation%s [%s]" % (count, "" if count == 1 else "s", clock(elapsed))


class Watch(object):
  """Shows one run's status line: rewritten in place (\\r) on a terminal at every tick, else a
  plain line every `plain_every` seconds; `finish` ends it with a summary line."""

  def __init__(self, name, total_steps=None, stream=None, plain_every=10.0, now=time.time):
    self.name, self.total, self.now = name, total_steps, now
    self.stream = stream or sys.stdout
    self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
    self.plain_every = plain_every
    self.state = TrainerState()
    self.start = self.last_print = now()
    self.shown = False
    self.width = 0

  def feed(self, text):
    return self.state.feed(text)

  def line(self):
    return status_line(self.name, self.state, self.total, self.now() - self.start)

  def tick(self):
    """Shows the status: on a terminal always, else when plain_every seconds have passed."""
    now = self.now()
    if self.tty:
      self._rewrite(self.line())
    elif now - self.last_print >= self.plain_every:
      self.stream.write(self.line() + "\n")
      self.last_print = now
    else:
      return
    self.shown = True
    self.stream.flush()

  def finish(self):
    """Ends the status: a training run with its final line; another binary with "done" if a
    status was shown (on a terminal the line is cleared instead)."""
    text = final_line(self.name, self.state, self.total, self.now() - self.start)
    if self.tty:
      if self.total is not None:
        self._rewrite(text)
        self.stream.write("\n")
      elif self.shown:
        self._rewrite("")
        self.stream.write("\r")
    elif self.total is not None or self.shown:
      self.stream.write(text + "\n")
    self.stream.flush()

  def _rewrite(self, text):
    self.stream.write("\r" + text.ljust(self.width))
    self.width = len(text)
