"""The output projection and its loss a chunk of positions at a time (hparam `logits_chunk_size`).

`chunked_loss(x, kernel, bias, labels, weights, chunk, xent)` is
sum_i weights_i * xent(x_i kernel + bias, labels_i) over every position i of x [b, n, e], with
the logits of `chunk` positions at a time: the forward pass keeps only each chunk's scalar sum,
and the backward pass recomputes a chunk's logits once the loss gradient has arrived and
differentiates them with the ops of the unchunked loss, one chunk after the other (control
dependencies), so at most one chunk's [b, chunk, vocab] logits, softmax and gradient are alive,
never the whole [b, n, vocab] tensors. The result equals the unchunked loss up to the order of
the float sums (the chunks' sums and their kernel gradients are added chunk by chunk).
"""
import tensorflow as tf

from routing_transformer.core import layers
from routing_transformer.core import rebuild
from routing_transformer.core.attention import common


def chunk_bounds(length, chunk):
  """[(start, size)] of consecutive chunks of `chunk` positions covering `length` (the last one
  may be shorter)."""
  if chunk <= 0:
    raise ValueError("chunk_bounds: chunk must be positive, got %d." % chunk)
  return [(start, min(chunk, length - start)) for start in range(0, length, chunk)]


def project(x, kernel, bias):
  """x [b, c, e] kernel [e, V] + bias [V], as a dense layer computes it (tensordot, bias_add;
  `layers.apply_kernel`, whose kernel gradient rebuilds a rebuildable x, e.g. a norm's output)."""
  return tf.nn.bias_add(layers.apply_kernel(x, kernel), bias)


def _add(total, value):
  return value if total is None else total + value


def chunked_loss(x, kernel, bias, labels, weights, chunk, xent):
  """Sum of weights * xent over the projected positions, `chunk` positions at a time.

  Args:
    x: [b, n, e] float inputs of the output projection (n static).
    kernel: [e, V] float; bias: [V] float.
    labels: int [b, n].
    weights: float32 [b, n] (0 where a position does not count).
    chunk: positions per chunk (Python int > 0); each chunk holds [b, chunk, V] logits.
    xent: (logits [b, c, V], labels [b, c]) -> float32 [b, c] per-position losses.
  Returns:
    float32 scalar: sum over positions of weights * xent.
  """
  x, kernel, bias = (tf.convert_to_tensor(t) for t in (x, kernel, bias))
  if x.shape.rank != 3 or x.shape[1] is None:
    raise ValueError("chunked_loss: x must be [batch, length, depth] with a static length, got "
                     "%s." % x.shape)
  bounds = chunk_bounds(x.shape[1], chunk)

  def chunk_sum(x_chunk, kernel, bias, start, size):
    labels_chunk = common.slice_axis(labels, 1, start, size)
    weights_chunk = common.slice_axis(weights, 1, start, size)
    losses = xent(project(x_chunk, kernel, bias), labels_chunk)
    return tf.reduce_sum(losses * weights_chunk)

  @tf.custom_gradient
  def loss_sum(x, kernel, bias):
    total, previous = None, []
    for start, size in bounds:
      with tf.control_dependencies(previous):  # one chunk's logits at a time
        x_chunk = common.slice_axis(x, 1, start, size)
      part = chunk_sum(x_chunk, kernel, bias, start, size)
      total, previous = _add(total, part), [part]

    def grad(dtotal):
      dxs, dkernel, dbias, previous = [], None, None, [dtotal]
      x_kept = rebuild.for_gradient(x, dtotal)  # a norm's output: rebuilt, not kept
      for start, size in bounds:
        with tf.control_dependencies(previous):  # after the loss gradient / the last chunk
          x_chunk = common.slice_axis(x_kept, 1, start, size)
        part = chunk_sum(x_chunk, kernel, bias, start, size)
        dx, dk, db = tf.gradients(part, [x_chunk, kernel, bias], dtotal)
        dxs.append(dx)
        dkernel, dbias = _add(dkernel, dk), _add(dbias, db)
        previous = [dx, dkernel, dbias]
      return tf.concat(dxs, axis=1), dkernel, dbias

    return total, grad

  return loss_sum(x, kernel, bias)
