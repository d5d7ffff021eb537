"""Blocked local attention (the paper's local heads): blocks of `block_length` (`query_shape`)
attend to themselves (causal: a triangle) and `flange / block_length` blocks before them
(`memory_flange`; non-causal: also after them)."""
import tensorflow as tf

from routing_transformer.core.attention import common
from routing_transformer.core.attention import full
from routing_transformer.core import memory


def check_blocks(length, block_length, flange, name):
  """Validates the block layout; raises ValueError naming the argument and the fix."""
  if block_length <= 0 or length % block_length:
    raise ValueError(
        "%s: length %d is not a multiple of block_length (query_shape) %d; pad the sequence to a "
        "multiple of the block (e.g. max_length=%d) or choose a block that divides it."
        % (name, length, block_length, -(-length // max(block_length, 1)) * max(block_length, 1)))
  if flange < 0 or flange % block_length:
    raise ValueError(
        "%s: flange (memory_flange) %d is not a non-negative multiple of block_length "
        "(query_shape) %d; use e.g. memory_flange=%d."
        % (name, flange, block_length, max(block_length, flange // block_length * block_length)))


def memory_blocks(x, block_length, before, after):
  """x [b, h, n, ...] -> [b, h, n / block_length, (before + 1 + after) * block_length, ...]:
  every block with `before` blocks before and `after` after it; zeros outside the sequence."""
  num_blocks = x.shape[2] // block_length
  rest = x.shape[3:].as_list()
  paddings = [[0, 0], [0, 0], [before * block_length, after * block_length]] + [[0, 0]] * len(rest)
  padded = tf.pad(x, paddings)
  heads = x.shape[1] if x.shape[1] is not None else -1
  blocks = tf.reshape(padded, [-1, heads, num_blocks + before + after, block_length] + rest)
  return tf.concat([common.slice_axis(blocks, 2, j, num_blocks)
                    for j in range(before + 1 + after)], axis=3)


def memory_product(a, x, block_length, before, after, adjoint_b=False):
  """tf.matmul(a, memory_blocks(x, ...), adjoint_b=adjoint_b) as a `memory.recompute_tensors`
  block: the backward pass keeps a and x and builds the blocks ((before + 1 + after) times x's
  size) again. A batch matmul, not an einsum, whose gradient for the blocks also transposes its
  output. a: [b, h, nb, bq, d] queries (adjoint_b: logits a . blocks^T) or [b, h, nb, bq, W]
  weights; x: [b, h, n, d]; W = (before + 1 + after) * block_length. Returns [b, h, nb, bq, W]
  (adjoint_b) or [b, h, nb, bq, d]."""
  return memory.recompute_tensors(
      lambda a, x: tf.matmul(a, memory_blocks(x, block_length, before, after),
                             adjoint_b=adjoint_b), a, x)


def local_attention(q, k, v, block_length, flange, causal=True, relative_keys=None,
                    relative_values=None, padding=None, scale=None, dropout_rate=0.0):
  """Blocked local self-attention: q, k, v [b, h, n, d] (n a multiple of block_length, flange a
  multiple of it) -> [b, h, n, d]; a query with no allowed key gets 0.

  relative_keys / relative_values: optional [2R + 1, d] Shaw tables (q_i . r[clip(j - i)] added
  to the logits, sum_j a_ij r[clip(j - i)] to the output); padding: optional [b, n], nonzero at
  padding keys; scale: applied to q (default d ** -0.5); dropout_rate: on the weights
  (`common.attention_dropout`).
  """
  name = "local_attention"
  q, k, v, relative_keys, relative_values, heads, n, depth = common.self_attention_inputs(
      q, k, v, relative_keys, relative_values, name)
  check_blocks(n, block_length, flange, name)
  num_blocks = n // block_length
  if causal and num_blocks == 1 and full.causal_block_length(n, relative_keys,
                                                             relative_values) < n:
    # one causal block of the whole length (full_attention): query blocks skip the masked half
    return full.causal_full_attention(q, k, v, relative_keys, relative_values, padding, scale,
                                      dropout_rate)
  if scale is None:
    scale = depth ** -0.5
  before = flange // block_length
  after = 0 if causal else before

  q_blocks = tf.reshape(q * scale, [-1, heads, num_blocks, block_length,
                                                          depth])
  # [b, h, nb, bq, W]
  logits = memory_product(q_blocks, k, block_length, before, after, adjoint_b=True)

  query_offsets = tf.range(block_length)
  key_offsets = tf.range((before + 1 + after) * block_length) - flange  # from the block start
  if relative_keys is not None:
    logits += common.relative_logits(q_blocks, relative_keys, 0, -flange, key_offsets.shape[0],
                                     causal=causal)

  block_starts = tf.range(num_blocks)[:, tf.newaxis, tf.newaxis] * block_length
  key_positions = block_starts + key_offsets[tf.newaxis, tf.newaxis, :]  # [nb, 1, W]
  allowed = tf.logical_and(key_positions >= 0, key_positions < n)
  if causal:
    query_positions = block_starts + query_offsets[tf.newaxis, :, tf.newaxis]  # [nb, bq, 1]
    allowed = tf.logical_and(allowed, key_positions <= query_positions)
  allowed = allowed[tf.newaxis, tf.newaxis]  # [1, 1, nb, bq or 1, W]
  pad = common.key_padding(padding, None, n, name)
  if pad is not None:
    pad_memory = memory_blocks(tf.cast(pad, tf.int32)[:, tf.newaxis, :], block_length, before,
                               after)  # [b, 1, nb, W]
    allowed = tf.logical_and(allowed, tf.equal(pad_memory, 0)[:, :, :, tf.newaxis, :])

  # a query whose allowed keys are all padding gets 0
  probs = common.attention_dropout(
      common.masked_softmax(logits, allowed, zero_empty=pad is not None), dropout_rate)
  out = memory_product(probs, v, block_length, before, after)
  if relative_values is not None:
    out += common.relative_outputs(probs, relative_values, 0, -flange, causal=causal)
  return tf.reshape(out, [-1, heads, n, v.shape[-1]])
