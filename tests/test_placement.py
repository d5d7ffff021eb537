"""Without a visible GPU, T2T's single-machine data shards and variables go on the CPU (no
soft-placement colocation warnings); with GPUs T2T's placement is kept."""
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
