"""Residual dropout (layer_prepostprocess_dropout) where the original puts it: on the decoder's
input (after the embedding's dense layer) and on each sub-layer's output in the post-process
"dan" (dropout, add, norm), in TRAIN mode only. Every dropout the model draws is recorded (and
passed through) while the graph is built."""
import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
from routing_transformer.t2t import model as model_lib
from hparams import sets
from tensor2tensor.data_generators import problem_hparams

tf1 = tf.compat.v1
VOCAB = 40


def recorded_dropouts(monkeypatch, mode, rate=0.1):
  calls = []

  def v2(x, rate=None, **kwargs):
    del kwargs
    calls.append((float(rate), x.name))
    return x

  def v1(x, keep_prob=None, noise_shape=None, seed=None, name=None, rate=None):
    del noise_shape, seed, name
    calls.append((float(rate if rate is not None else 1.0 - keep_prob), x.name))
    return x

  monkeypatch.setattr(tf.nn, "dropout", v2)
  monkeypatch.setattr(tf1.nn, "dropout", v1)
  hparams = sets.routing_transformer_test()
  hparams.layer_prepostprocess_dropout = rate
  with tf.Graph().as_default():
    model = model_lib.RoutingTransformer(
        hparams, mode, problem_hparams.test_problem_hparams(VOCAB, VOCAB, hparams))
    model({"targets": tf.constant(np.ones((2, 64, 1, 1), np.int32))})
  return [c for c in calls if c[0] > 0]


def test_train_mode_drops_the_input_and_every_sub_layer_output(monkeypatch):
  calls = recorded_dropouts(monkeypatch, tf.estimator.ModeKeys.TRAIN)
  layers = sets.routing_transformer_test().num_decoder_layers
  assert len(calls) == 1 + 2 * layers, calls  # input; attention and FFN of each layer
  assert all(rate == pytest.approx(0.1) for rate, _ in calls)
  assert "emb_dense" in calls[0][1]  # the input dropout comes first, on the embedding
  for i in range(layers):
    block = [name for _, name in calls[1 + 2 * i:3 + 2 * i]]
    assert all("decoder_layer_%d/" % i in name for name in block), block
    assert "self_attention" in block[0] and "ffn" in block[1], block


@pytest.mark.parametrize("mode", [tf.estimator.ModeKeys.EVAL, tf.estimator.ModeKeys.PREDICT])
def test_no_residual_dropout_outside_training(monkeypatch, mode):
  assert recorded_dropouts(monkeypatch, mode) == []
