"""Without a visible GPU, T2T's single-machine data shards and variables go on the CPU (no
soft-placement colocation warnings); with GPUs T2T's placement is kept."""
import os

import pytest

import t2t_usr_dir  # pylint: disable=unused-import  (installs the glue)
from routing_transformer.t2t import glue as t2t_glue
from tensor2tensor.utils import devices


@pytest.mark.parametrize("gpus,shards,want", [
    (False, 1, ["cpu:0"]),
    (False, 2, ["cpu:0", "cpu:0"]),
    (True, 2, ["gpu:0", "gpu:1"]),
])
def test_shards_and_variables_on_cpu_only_without_gpu(monkeypatch, gpus, shards, want):
  monkeypatch.setattr(t2t_glue, "gpus_visible", lambda: gpus)
  parallelism = devices.data_parallelism(worker_gpu=shards, schedule="train")
  assert parallelism.n == shards
  assert parallelism._devices == want  # pylint: disable=protected-access
  assert parallelism._ps_devices == want  # pylint: disable=protected-access


def test_other_tasks_and_device_functions_are_left_alone():
  assert t2t_glue.on_cpu("gpu:3") == "cpu:0" and t2t_glue.on_cpu("") == ""
  assert t2t_glue.on_cpu("/job:worker/GPU:1") == "/job:worker/GPU:1"
  fn = lambda op: "/job:ps"  # pylint: disable=unnecessary-lambda-assignment
  assert t2t_glue.on_cpu(fn) is fn


@pytest.mark.parametrize("enabled,environ,hint", [
    (False, {}, True),  # TF's own default left oneDNN off (an AVX2-only CPU)
    (True, {}, False),
    (None, {}, False),  # TF does not say
    (False, {"TF_ENABLE_ONEDNN_OPTS": "0"}, False),  # the user chose
])
def test_onednn_hint_only_where_tf_left_onednn_off_by_default(enabled, environ, hint):
  line = t2t_glue.onednn_hint(enabled, environ)
  assert (line == t2t_glue.ONEDNN_HINT) if hint else line is None
  assert "TF_ENABLE_ONEDNN_OPTS=1" in t2t_glue.ONEDNN_HINT


@pytest.mark.parametrize("enabled", [False, True])
def test_cpu_placement_logs_the_onednn_hint_when_onednn_is_off(monkeypatch, enabled):
  """The CPU-only data_parallelism logs the hint once per call where oneDNN is off by TF's
  default, and not where it is on."""
  logged = []
  monkeypatch.setattr(t2t_glue, "gpus_visible", lambda: False)
  monkeypatch.setattr(t2t_glue, "onednn_enabled", lambda: enabled)
  monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(tf.compat.v1.logging, "info", lambda msg, *a: logged.append(msg % a))
  devices.data_parallelism(worker_gpu=1, schedule="train")
  assert logged.count(t2t_glue.ONEDNN_HINT) == (0 if enabled else 1), logged
  assert any(line.startswith("No GPU visible") for line in logged)


def test_onednn_enabled_reads_tensorflow():
  """TF 2.15 says whether its oneDNN ops are on: a bool, as TF_ENABLE_ONEDNN_OPTS says where it
  is set."""
  enabled = t2t_glue.onednn_enabled()
  assert enabled in (True, False)
  choice = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
  if choice in ("0", "1"):
    assert enabled == (choice == "1")
