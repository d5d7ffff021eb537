"""Multi-head plumbing shared by the T2T layers (`layers.py`) and the Keras layer (`keras.py`).

Splitting and combining heads, and the dispatch of one layer's heads to the attention functions:
routing heads first along the head axis, then local heads. Does not import Tensor2Tensor.

Shapes: x [b, n, h * d]; heads [b, h, n, d].
"""
import collections

import tensorflow as tf

from routing_transformer.core import attention

HeadConfig = collections.namedtuple("HeadConfig", [
    "window", "block_length", "flange", "share_qk", "routing_mode", "random_routing",
    "legacy_causal_key_routing", "routing_padding_as_original"], defaults=(False,))
HeadConfig.__doc__ = """How a layer's heads attend (the attention functions' static arguments).

window: members per routing cluster; block_length, flange: the local heads' blocks (query_shape,
memory_flange); share_qk, routing_mode ("topk" | "causal_window"), random_routing,
legacy_causal_key_routing, routing_padding_as_original (default False): as the hparams of the
same names.
"""


def _dims(x):
  """Static dims where known, else dynamic (batch may be unknown in Keras)."""
  dynamic = tf.shape(x)
  return [d if d is not None else dynamic[i] for i, d in enumerate(x.shape.as_list())]


def split_heads(x, heads):
  """[b, n, h * d] -> [b, h, n, d]."""
  b, n, hd = _dims(x)
  x = tf.reshape(x, [b, n, heads, hd // heads])
  return tf.transpose(x, [0, 2, 1, 3])


def combine_heads(x):
  """[b, h, n, d] -> [b, n, h * d]."""
  b, h, n, d = _dims(x)
  return tf.reshape(tf.transpose(x, [0, 2, 1, 3]), [b, n, h * d])


def routing_heads_attention(q, k, v, means, config, causal=True, padding=None,
                            tables=(None, None), options=None, dropout_rate=0.0):
  """The routing heads: (output [b, hr, n, d], aux of the attention function).

  k is ignored when config.share_qk (keys are the queries); decoders with
  routing_mode="causal_window" use `causal_window_attention`, everything else (and every
  encoder) the paper's top-k routing. `options`: further keyword arguments of both functions
  (the extensions exclude_self, logit_scale). dropout_rate: attention dropout on the weights
  (TRAIN mode). dropout_rate and config.routing_padding_as_original reach the functions only
  when set, so a call without them is the paper's call, keyword for keyword.
  """
  options = dict(options or {})
  if dropout_rate:
    options["dropout_rate"] = dropout_rate
  if config.routing_padding_as_original:
    options["padding_as_original"] = True
  rel_k, rel_v = tables
  if config.share_qk:
    k = q
  if causal and config.routing_mode == "causal_window":
    return attention.causal_window_attention(
        q, k, v, means, config.window, share_qk=config.share_qk, padding=padding,
        relative_keys=rel_k, relative_values=rel_v, **options)
  return attention.routing_attention(
      q, k, v, means, config.window, causal=causal, share_qk=config.share_qk, padding=padding,
      relative_keys=rel_k, relative_values=rel_v, random_routing=config.random_routing,
      legacy_causal_key_routing=config.legacy_causal_key_routing, **options)


def local_heads_attention(q, k, v, config, causal=True, padding=None, tables=(None, None),
                          dropout_rate=0.0):
  """The local heads: blocked attention [b, hl, n, d] (unscaled: q carries d^-0.5), attention
  dropout `dropout_rate` on the weights."""
  rel_k, rel_v = tables
  return attention.local_attention(
      q, k, v, config.block_length, config.flange, causal=causal, relative_keys=rel_k,
      relative_values=rel_v, padding=None if causal else padding, scale=1.0,
      dropout_rate=dropout_rate)


def mixed_heads(q, k, v, num_routing, config, causal=True, padding=None, means=None,
                routing_tables=(None, None), local_tables=(None, None), routing_options=None,
                dropout_rate=0.0):
  """All heads of a layer: the first `num_routing` route, the rest attend locally.

  Args:
    q, k, v: [b, h, n, d] (q already scaled by d^-0.5; routing normalises it anyway).
    num_routing: number of routing heads (0..h).
    config: HeadConfig.
    causal: decoder (True) or encoder (False) self-attention.
    padding: optional bool [b, n], True at padding positions.
    means: [num_routing, c, d] centroids (needed when num_routing > 0).
    routing_tables, local_tables: (relative keys, relative values) [2R + 1, d] or Nones.
    routing_options: further keyword arguments of the routing attention functions.
    dropout_rate: attention dropout on the weights of every head (hparam `attention_dropout`;
      the caller passes 0 outside TRAIN mode).
  Returns:
    (output [b, h, n, d], aux of the routing attention or None without routing heads).
  """
  outputs, aux = [], None
  if num_routing:
    out, aux = routing_heads_attention(
        q[:, :num_routing], k[:, :num_routing], v[:, :num_routing], means, config, causal,
        padding, routing_tables, routing_options, dropout_rate)
    outputs.append(out)
  if q.shape[1] > num_routing:
    outputs.append(local_heads_attention(
        q[:, num_routing:], k[:, num_routing:], v[:, num_routing:], config, causal, padding,
        local_tables, dropout_rate))
  return (tf.concat(outputs, axis=1) if len(outputs) > 1 else outputs[0]), aux
