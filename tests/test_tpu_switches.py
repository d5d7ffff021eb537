"""With --use_tpu (XLA) the model refuses, in one line, the memory switches that save (almost)
nothing there: XLA merges their recomputation with the forward pass (benchmarks/xla_memory.py:
the step's buffer assignment with them is 0.96-1.00x the plain step's, with chunked logits more)."""
import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
from routing_transformer.t2t import model as model_lib
from hparams import sets
from tensor2tensor.data_generators import problem_hparams

tf1 = tf.compat.v1
VOCAB = 40


def build_and_optimize(use_tpu, **switches):
  hparams = sets.routing_transformer_test()
  for name, value in switches.items():
    setattr(hparams, name, value)
  with tf.Graph().as_default():
    model = model_lib.RoutingTransformer(
        hparams, tf.estimator.ModeKeys.TRAIN,
        problem_hparams.test_problem_hparams(VOCAB, VOCAB, hparams))
    _, losses = model({"targets": tf.constant(np.ones((2, 64, 1, 1), np.int32))})
    return model.optimize(sum(losses.values()), use_tpu=use_tpu)


@pytest.mark.parametrize("switches", [
    {"recompute_layers": True},
    {"recompute_attention": True},
    {"recompute_layers": True, "recompute_attention": True},
    {"logits_chunk_size": 16},
    {"ffn_chunk_size": 16, "recompute_layers": True},
])
def test_tpu_refuses_the_switches_xla_drops(switches):
  with pytest.raises(model_lib.HParamsError) as error:
    build_and_optimize(True, **switches)
  message = str(error.value)
  assert "\n" not in message and "save at most 4% of memory on TPU" in message
  for name, value in switches.items():
    assert "%s=%s" % (name, value) in message


def test_the_same_switches_build_off_tpu():
  assert build_and_optimize(False, recompute_layers=True) is not None
