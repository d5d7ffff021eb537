"""Long runs and their disks: time-based checkpoints, and one line for a full or lost folder.

- `TimedCheckpointHook`: a checkpoint every `secs` seconds as well as T2T's every N steps, through
  the Estimator's own Saver (one list of kept checkpoints, one `checkpoint` state file).
- `disk_problem` / `disk_message`: a write that failed because the disk is full, the folder is
  read-only or has vanished (a checkpoint, a summary, a datagen shard) becomes one line naming the
  folder, roughly what a checkpoint needs and the checkpoint the next run resumes from; the
  traceback goes to a log file (`write_traceback`).
"""
import errno
import os
import re
import sys
import tempfile
import time
import traceback

import tensorflow as tf

from routing_transformer.t2t import checkpoint_files

tf1 = tf.compat.v1

DEFAULT_CHECKPOINT_SECS = 1800  # t2t-trainer without --save_checkpoints_secs: every 30 minutes
_VARIABLE_BYTES = {}  # model_dir -> bytes of the graph's variables (set by TimedCheckpointHook)


def variable_bytes(variables):
  """Bytes the values of `variables` take in a checkpoint (static shapes)."""
  return sum(v.shape.num_elements() * v.dtype.base_dtype.size for v in variables
             if v.shape.is_fully_defined())


class TimedCheckpointHook(tf1.train.SessionRunHook):
  """Saves a checkpoint every `secs` seconds (0: never) besides the Estimator's step-based ones.

  Uses the graph's Saver (the Estimator's), so keep_checkpoint_max counts both kinds; saves
  nothing at the start and end of a run (the Estimator's hook does) and nothing at a step the
  other hook already saved. Not a CheckpointSaverHook: the Estimator would then drop its own.
  Also records the variables' bytes for `disk_message` (a first checkpoint that does not fit).
  """

  def __init__(self, model_dir, secs):
    self.model_dir, self.secs = model_dir, secs
    self.saved = []  # steps this hook saved

  def begin(self):
    _VARIABLE_BYTES[self.model_dir] = variable_bytes(tf1.global_variables())
    self._step = tf1.train.get_global_step()
    self._timer = tf1.train.SecondOrStepTimer(every_secs=self.secs) if self.secs else None

  def after_create_session(self, session, coord):
    del coord
    if self._timer:
      self._timer.update_last_triggered_step(session.run(self._step))

  def before_run(self, run_context):
    del run_context
    return tf1.train.SessionRunArgs(self._step) if self._timer else None

  def after_run(self, run_context, run_values):
    if not self._timer or not self._timer.should_trigger_for_step(run_values.results + 1):
      return
    step = int(run_context.session.run(self._step))
    self._timer.update_last_triggered_step(step)
    latest = tf.train.latest_checkpoint(self.model_dir)
    if latest and checkpoint_files.checkpoint_step(latest) == step:
      return  # the step-based hook saved this step
    savers = tf1.get_collection(tf1.GraphKeys.SAVERS)
    if not savers:
      return
    tf1.logging.info("Saving a time-based checkpoint (every %d s) for step %d.", self.secs, step)
    savers[0].save(run_context.session, os.path.join(self.model_dir, "model.ckpt"),
                   global_step=step, write_meta_graph=False)
    self.saved.append(step)


# ---------------------------------------------------------------------------------------------
# A write that failed for lack of disk.

_PATH = re.compile(r"((?:gs|s3|hdfs)://[^\s;,'\"]+|/[^\s;,:'\"]+)")


def _path_in(text):
  match = _PATH.search(text or "")
  return match.group(1) if match else None


def disk_problem(error):
  """(kind, path or None) when `error` is a write that failed for lack of disk, else None.

  kind: "full" (ENOSPC), "read-only" (EROFS), "not writable" (EACCES/EPERM) or "vanished" (the
  folder was removed while the run wrote into it).
  """
  if isinstance(error, OSError) and error.errno is not None:
    kinds = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EROFS: "read-only",
             errno.EACCES: "not writable", errno.EPERM: "not writable"}
    path = error.filename if isinstance(error.filename, str) else None
    if error.errno in kinds:
      return kinds[error.errno], path
    if error.errno == errno.ENOENT and path and not os.path.isdir(os.path.dirname(path)):
      return "vanished", path
    return None
  text = str(getattr(error, "message", None) or error)
  if "No space left on device" in text or "Disk quota exceeded" in text:
    return "full", _path_in(text)
  if "Read-only file system" in text:
    return "read-only", _path_in(text)
  if isinstance(error, tf.errors.PermissionDeniedError) or (
      isinstance(error, tf.errors.OpError) and "Permission denied" in text):
    return "not writable", _path_in(text)
  vanished = re.search(r"Parent directory of (\S+) doesn't exist, can't save", text)
  if vanished:
    return "vanished", vanished.group(1)
  if isinstance(error, tf.errors.NotFoundError):
    path = _path_in(text)
    if path and not tf.io.gfile.isdir(os.path.dirname(path)):
      return "vanished", path
  return None


def _under(path, folder):
  if not (path and folder):
    return False
  folder = folder.rstrip("/") + "/"
  return (path.rstrip("/") + "/").startswith(folder)


def human_bytes(size):
  for unit in ("bytes", "KB", "MB", "GB", "TB"):
    if size < 1000 or unit == "TB":
      return ("%d %s" if unit == "bytes" else "%.1f %s") % (size, unit)
    size /= 1000.0


def checkpoint_need(model_dir):
  """'~24.0 MB (the files of model.ckpt-50)' or '~... (the variables' bytes)', or None."""
  newest = checkpoint_files.newest_complete(model_dir) if tf.io.gfile.isdir(model_dir) else None
  if newest:
    return "~%s (the files of %s)" % (human_bytes(checkpoint_files.checkpoint_bytes(newest)),
                                      os.path.basename(newest))
  if _VARIABLE_BYTES.get(model_dir):
    return "~%s (the variables' bytes)" % human_bytes(_VARIABLE_BYTES[model_dir])
  return None


_KIND_TEXT = {"full": "no space left on the disk of %s", "read-only": "%s is read-only",
              "not writable": "%s is not writable", "vanished": "%s vanished"}


def disk_message(kind, path, model_dir=None, data_dir=None, log_path=None):
  """One line for a failed write: the folder, what a checkpoint needs, where the next run starts.

  model_dir: the training output folder (t2t-trainer --output_dir), or None; data_dir: the
  datagen folder, or None. path: the file whose write failed (from the error), or None.
  """
  folder = next((f for f in (model_dir, data_dir) if f and (_under(path, f) or not path)), None)
  folder = folder or (os.path.dirname(path) if path else "the output folder")
  parts = [_KIND_TEXT[kind] % folder]
  if path and path.rstrip("/") != folder.rstrip("/"):
    parts[0] += " (writing %s)" % path
  if model_dir and folder == model_dir:
    need = checkpoint_need(model_dir)
    if need:
      parts.append("a checkpoint needs %s" % need)
    if tf.io.gfile.isdir(model_dir):
      resume, _ = checkpoint_files.resume_checkpoint(model_dir)
    else:
      resume = None
    parts.append("the next run resumes from %s" % (resume or "scratch (no complete checkpoint)"))
    fix = ("free space (or pass another --output_dir holding a copy of the checkpoints) and run the "
           "same command" if kind == "full" else "make the folder writable again and run the same "
           "command")
  elif data_dir and folder == data_dir:
    parts.append("the complete shards are kept and a re-run of t2t-datagen writes only the "
                 "missing ones")
    fix = "free space and run t2t-datagen again" if kind == "full" else "fix the folder and " \
        "run t2t-datagen again"
  else:
    fix = "free space and run again" if kind == "full" else "fix the folder and run again"
  text = "%s; %s: %s." % (parts[0], "; ".join(parts[1:]) or "nothing was written", fix)
  if log_path:
    text += " Traceback: %s" % log_path
  return text


def write_traceback(kind, value, tb, program=None):
  """Writes the full traceback to a new file in the temporary folder (the output folder may be
  full or gone); returns its path, or None when that fails too."""
  program = program or os.path.basename(sys.argv[0] or "python") or "python"
  path = os.path.join(tempfile.gettempdir(), "%s-error-%s-%d.log" % (
      program, time.strftime("%Y%m%d-%H%M%S", time.gmtime()), os.getpid()))
  try:
    with open(path, "w") as f:
      f.write("%s\n" % " ".join(sys.argv))
      f.write("".join(traceback.format_exception(kind, value, tb)))
    return path
  except OSError:
    return None
