"""Damaged checkpoints are found from the index alone, before anything restores them: training
falls back to the newest complete one (never deleting the damaged one), the read-only tools stop
with one line. Also: time-based checkpoints and the one line for a full or vanished disk."""
import errno
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.t2t import checkpoint_files as cf
from routing_transformer.t2t import reliability

tf1 = tf.compat.v1


def tensors(step, rng=np.random.RandomState(0)):
  out = {"global_step": np.asarray(step, np.int64), "a/kernel": rng.rand(7, 5).astype(np.float32),
         "b/means": rng.rand(2, 3, 4).astype(np.float32), "c/count": np.arange(9, dtype=np.int32)}
  out.update({"v%02d" % i: rng.rand(3, i + 1).astype(np.float32) for i in range(40)})
  return out


def write_run(folder, steps):
  """Checkpoints model.ckpt-<step> for `steps` and the `checkpoint` state naming the last."""
  prefixes = []
  for step in steps:
    prefix = os.path.join(folder, "model.ckpt-%d" % step)
    cf.write_checkpoint(prefix, tensors(step))
    prefixes.append(prefix)
  tf1.train.update_checkpoint_state(folder, prefixes[-1], all_model_checkpoint_paths=prefixes)
  return prefixes


def data_file(prefix):
  return prefix + ".data-00000-of-00001"


def truncate(path, keep):
  with open(path, "r+b") as f:
    f.truncate(keep)


@pytest.fixture
def run(tmp_path):
  return str(tmp_path), write_run(str(tmp_path), [2, 4, 6])


def test_index_entries_match_the_reader_and_the_data_file(run):
  _, prefixes = run
  header, entries = cf.read_index(prefixes[-1])
  reader = tf.train.load_checkpoint(prefixes[-1])
  assert set(entries) == set(reader.get_variable_to_shape_map())
  assert header.num_shards == 1
  # every tensor's bytes: its shape times its dtype's size, laid end to end in the data file
  for name, entry in entries.items():
    value = reader.get_tensor(name)
    assert entry.size == value.nbytes, name
  assert cf.expected_sizes(header, entries) == {0: os.path.getsize(data_file(prefixes[-1]))}
  assert cf.damage(prefixes[-1]) is None


def test_each_kind_of_damage_is_named(run):
  folder, prefixes = run
  newest = prefixes[-1]
  size = os.path.getsize(data_file(newest))
  truncate(data_file(newest), size - 1)  # one byte short: the last tensor cannot be read
  assert cf.damage(newest) == ("model.ckpt-6.data-00000-of-00001 is %d bytes but its index "
                               "expects %d (truncated: an interrupted write or copy)"
                               % (size - 1, size))
  entries = cf.read_index(newest)[1]
  last = max(entries, key=lambda n: entries[n].offset)
  with pytest.raises((tf.errors.OpError, IndexError), match="Read less bytes than requested"):
    tf.train.load_checkpoint(newest).get_tensor(last)  # what a restore would have met
  with open(data_file(newest), "ab") as f:
    f.write(b"xy")
  assert "(changed)" in cf.damage(newest)
  os.remove(data_file(newest))
  assert cf.damage(newest) == "model.ckpt-6.data-00000-of-00001 is missing"
  truncate(prefixes[1] + ".index", 100)
  assert cf.damage(prefixes[1]).startswith("model.ckpt-4.index is unreadable (")
  with open(prefixes[0] + ".index", "wb") as f:
    f.write(b"\0" * 4096)
  assert cf.damage(prefixes[0]).startswith("model.ckpt-2.index is unreadable (")
  assert cf.damage(os.path.join(folder, "model.ckpt-8")) == "model.ckpt-8.index is missing"


def test_read_only_tools_stop_with_one_line_naming_the_newest_good_checkpoint(run):
  folder, prefixes = run
  truncate(data_file(prefixes[-1]), 100)
  for path in (folder, prefixes[-1]):
    with pytest.raises(cf.DamagedCheckpointError) as error:
      cf.find_checkpoint(path)
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith("checkpoint %s is damaged: model.ckpt-6.data-00000-of-00001 is 100 "
                           "bytes" % prefixes[-1])
    assert "The newest complete checkpoint is %s: pass it instead" % prefixes[1] in text
  assert cf.find_checkpoint(prefixes[1]) == prefixes[1]  # an intact older one is used as given
  assert os.path.exists(data_file(prefixes[-1]))  # nothing moved or deleted by a read-only tool


def test_the_tools_report_it_in_one_line(run, monkeypatch):
  from routing_transformer.tools import analysis
  from routing_transformer.tools import checkpoints
  from routing_transformer.tools import evaluate
  from routing_transformer.tools import score
  folder, prefixes = run
  truncate(data_file(prefixes[-1]), 100)
  expected = re.escape("checkpoint %s is damaged" % prefixes[-1])
  with pytest.raises(score.ScorerError, match=expected):
    score.Scorer(folder, "routing_transformer_tiny", vocab=None, problem="synthetic_long_range")
  with pytest.raises(evaluate.EvaluationError, match=expected):
    evaluate.evaluate("synthetic_long_range", "routing_transformer_tiny", folder, folder)
  with pytest.raises(SystemExit, match=expected):
    analysis.collect(folder, "synthetic_long_range", folder, "routing_transformer_tiny")
  with pytest.raises(SystemExit, match=expected):
    checkpoints.main(["--from", folder, "--to", os.path.join(folder, "converted")])


def test_training_falls_back_and_keeps_the_damaged_checkpoint(run):
  folder, prefixes = run
  truncate(data_file(prefixes[-1]), 100)
  truncate(prefixes[1] + ".index", 10)
  kept = {p: open(p, "rb").read() for p in (data_file(prefixes[-1]), prefixes[1] + ".index")}
  warning = cf.prepare_resume(folder)
  assert warning.startswith("warning: checkpoint model.ckpt-6 is damaged (model.ckpt-6.data-"
                            "00000-of-00001 is 100 bytes")
  assert warning.endswith("; resuming from %s, the newest complete checkpoint." % prefixes[0])
  assert "\n" not in warning
  assert tf.train.latest_checkpoint(folder) == prefixes[0]
  state = tf1.train.get_checkpoint_state(folder)
  assert list(state.all_model_checkpoint_paths) == [prefixes[0]]  # the Saver never deletes them
  damaged = os.path.join(folder, cf.DAMAGED_DIR)
  for path, data in kept.items():  # moved byte for byte, so a new save cannot overwrite them
    with open(os.path.join(damaged, os.path.basename(path)), "rb") as f:
      assert f.read() == data
  assert not os.path.exists(prefixes[-1] + ".index")
  assert cf.prepare_resume(folder) is None  # a second start changes nothing


def test_missing_state_file_resumes_from_the_newest_complete_checkpoint(run):
  folder, prefixes = run
  os.remove(os.path.join(folder, "checkpoint"))
  assert tf.train.latest_checkpoint(folder) is None  # TF alone would start from scratch
  assert "state file" in cf.prepare_resume(folder)
  assert tf.train.latest_checkpoint(folder) == prefixes[-1]


def test_no_complete_checkpoint_stops_training(run):
  folder, prefixes = run
  for prefix in prefixes:
    os.remove(data_file(prefix))
  with pytest.raises(cf.DamagedCheckpointError, match="no complete checkpoint in %s" % folder):
    cf.prepare_resume(folder)
  assert all(os.path.exists(p + ".index") for p in prefixes)
  assert cf.prepare_resume(str(os.path.join(folder, "new"))) is None  # a new run: nothing to do


def test_a_deliberate_rollback_in_the_state_file_is_respected(run):
  folder, prefixes = run
  tf1.train.update_checkpoint_state(folder, prefixes[0], all_model_checkpoint_paths=prefixes[:1])
  assert cf.prepare_resume(folder) is None
  assert tf.train.latest_checkpoint(folder) == prefixes[0]


# ---------------------------------------------------------------------------------------------
# Time-based checkpoints


def test_timed_checkpoints_every_secs_besides_the_step_ones(tmp_path, monkeypatch):
  from tensorflow.python.training import basic_session_run_hooks
  clock = {"now": 1000.0}
  monkeypatch.setattr(basic_session_run_hooks.time, "time", lambda: clock["now"])
  with tf.Graph().as_default():
    step = tf1.train.get_or_create_global_step()
    w = tf1.get_variable("w", [3, 4])
    train = tf1.assign_add(step, 1)
    hooks = [reliability.TimedCheckpointHook(str(tmp_path), 25)]
    with tf1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path), hooks=hooks,
                                            save_checkpoint_steps=4,
                                            save_summaries_steps=None) as sess:
      for _ in range(9):
        sess.run(train)
        clock["now"] += 10.0  # ten seconds a step
  steps = sorted(cf.checkpoint_step(p[:-len(".index")]) for p in tf.io.gfile.glob(
      str(tmp_path / "*.index")))
  # The step hook: 0, 4, 8 and the end (9). The time hook, 25 s: due after step 4 (30 s since the
  # start; the step hook has just saved 4, so it skips), then after step 7 (30 s later).
  assert steps == [0, 4, 7, 8, 9]
  assert hooks[0].saved == [7]
  assert reliability._VARIABLE_BYTES[str(tmp_path)] == 3 * 4 * 4 + 8  # w, global_step


def test_save_checkpoints_secs_keeps_the_step_checkpoints(monkeypatch):
  import t2t_usr_dir  # pylint: disable=unused-import
  from tensor2tensor.utils import trainer_lib
  config = trainer_lib.create_run_config("routing_transformer", model_dir="/tmp/x",
                                         save_checkpoints_steps=500, save_checkpoints_secs=600)
  assert config.save_checkpoints_steps == 500 and config.save_checkpoints_secs is None


# ---------------------------------------------------------------------------------------------
# Disk full, read-only, vanished


def test_disk_problems_are_recognised():
  full = tf.errors.ResourceExhaustedError(
      None, None, "/out/model.ckpt-9_temp/part-00000-of-00001.data-00000-of-00001.tempstate1; "
      "No space left on device")
  assert reliability.disk_problem(full) == (
      "full", "/out/model.ckpt-9_temp/part-00000-of-00001.data-00000-of-00001.tempstate1")
  assert reliability.disk_problem(OSError(errno.ENOSPC, "No space", "/d/x")) == ("full", "/d/x")
  assert reliability.disk_problem(OSError(errno.EROFS, "ro", "/d/x")) == ("read-only", "/d/x")
  gone = ValueError("Parent directory of /gone/model.ckpt doesn't exist, can't save.")
  assert reliability.disk_problem(gone) == ("vanished", "/gone/model.ckpt")
  assert reliability.disk_problem(tf.errors.NotFoundError(None, None, "/tmp; missing")) is None
  assert reliability.disk_problem(ValueError("bad hparams")) is None


def test_disk_message_names_folder_size_and_resume_point(run):
  folder, prefixes = run
  truncate(data_file(prefixes[-1]), 100)
  need = sum(os.path.getsize(p) for p in (prefixes[1] + ".index", data_file(prefixes[1])))
  text = reliability.disk_message("full", os.path.join(folder, "model.ckpt-8_temp/x"),
                                  model_dir=folder, log_path="/tmp/t.log")
  assert text == (
      "no space left on the disk of {d} (writing {d}/model.ckpt-8_temp/x); a checkpoint needs "
      "~{kb:.1f} KB (the files of model.ckpt-4); the next run resumes from {d}/model.ckpt-4: free "
      "space (or pass another --output_dir holding a copy of the checkpoints) and run the same "
      "command. Traceback: /tmp/t.log".format(d=folder, kb=need / 1000.0))
  text = reliability.disk_message("full", "/data/x-incomplete/x-train-00000-of-00001",
                                  data_dir="/data")
  assert "the complete shards are kept" in text and "run t2t-datagen again" in text
