"""A layer's heads (for `layers.py` and `keras.py`): split, combine, and dispatch to the attention
functions (routing heads first, then local), whole sequences or one cached decoding step.
x [b, n, h * d]; heads [b, h, n, d]."""
import collections
import contextlib

import tensorflow as tf

from routing_transformer.core import attention
from routing_transformer.core.attention import incremental
from routing_transformer.core.attention import routing as routing_lib

HeadConfig = collections.namedtuple("HeadConfig", [
    "window", "block_length", "flange", "share_qk", "routing_mode", "random_routing",
    "legacy_causal_key_routing", "routing_padding_as_original"], defaults=(False,))
HeadConfig.__doc__ = """How a layer's heads attend: window (sparsity_cluster_attention_window),
block_length, flange (query_shape, memory_flange) and the hparams of the other names."""


_OBSERVERS = []  # the active attention observers (`observing`)
_LAYER = []  # the index of the layer whose heads attend (`in_layer`)


@contextlib.contextmanager
def observing(observer):
  """While active, each whole-sequence attention call of the heads also calls
  observer(function, args, kwargs, result, layer index or None) (`tools.analysis`)."""
  _OBSERVERS.append(observer)
  try:
    yield observer
  finally:
    _OBSERVERS.remove(observer)


@contextlib.contextmanager
def in_layer(index):
  """The attention calls inside are layer `index`'s (for `observing`)."""
  _LAYER.append(index)
  try:
    yield
  finally:
    _LAYER.pop()


def _attend(function, *args, **kwargs):
  """function(*args, **kwargs), shown to the active observers."""
  result = function(*args, **kwargs)
  for observer in list(_OBSERVERS):
    observer(function, args, kwargs, result, _LAYER[-1] if _LAYER else None)
  return result


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
                            tables=(None, None), options=None, dropout_rate=0.0, cache=None,
                            position=None):
  """The routing heads: (output [b, hr, n, d], the attention's Routed / aux or None): top-k, or
  causal_window (causal); k ignored with share_qk; `options`: exclude_self, logit_scale. With
  `cache` (q, k, v [b, hr, 1, d] at `position`) it routes over the prefix, updating in place
  ("routing_k", "routing_v" [b, hr, N, d], "routing_scores" [b, hr, c, N]; or "routing_window")."""
  rel_k, rel_v = tables
  options = dict(options or {})
  if config.share_qk:
    k = q
  elif k is None:
    raise ValueError("routing_heads_attention: k is None but share_qk is False; pass the "
                     "routing heads' keys.")
  if cache is not None:
    if config.random_routing:
      raise ValueError("Cached decoding of random_routing models is not supported (members are "
                       "random draws); decode with fast_decode=False.")
    q_hat = attention.layer_norm_no_scale(q)
    k_hat = q_hat if config.share_qk else attention.layer_norm_no_scale(k)
    means = tf.cast(means, q_hat.dtype)
    if config.routing_mode == "causal_window":
      out, cache["routing_window"] = incremental.causal_window_step(
          q_hat, k_hat, v, means, cache["routing_window"], rel_k, rel_v, **options)
      return out, None
    scores = routing_lib.centroid_scores(q_hat, means)  # [b, hr, c, 1]
    cache["routing_k"] = incremental.write_cache(cache["routing_k"], k_hat, position)
    cache["routing_v"] = incremental.write_cache(cache["routing_v"], v, position)
    cache["routing_scores"] = incremental.write_cache(cache["routing_scores"], scores, position,
                                                      axis=3)
    return incremental.routing_attention_step(
        q_hat, cache["routing_k"], cache["routing_v"], cache["routing_scores"], position,
        config.window, relative_keys=rel_k, relative_values=rel_v, **options), None
  if dropout_rate:
    options["dropout_rate"] = dropout_rate
  if config.routing_padding_as_original:
    options["padding_as_original"] = True
  if causal and config.routing_mode == "causal_window":
    return _attend(attention.causal_window_attention, q, k, v, means, config.window,
                   share_qk=config.share_qk, padding=padding, relative_keys=rel_k,
                   relative_values=rel_v, **options)
  return _attend(
      attention.routing_attention, q, k, v, means, config.window, causal=causal,
      share_qk=config.share_qk, padding=padding, relative_keys=rel_k, relative_values=rel_v,
      random_routing=config.random_routing,
      legacy_causal_key_routing=config.legacy_causal_key_routing, **options)


def local_heads_attention(q, k, v, config, causal=True, padding=None, tables=(None, None),
                          dropout_rate=0.0, cache=None, position=None):
  """The local heads: blocked attention [b, hl, n, d] (q carries d^-0.5); with `cache`, over a
  ring of R slots ("local_k", "local_v" [b, hl, R, d], "local_pos" int32 [b, R], -1 = empty)."""
  rel_k, rel_v = tables
  if cache is not None:
    slot = position % cache["local_pos"].shape[1]
    cache["local_k"] = incremental.write_cache(cache["local_k"], k, slot)
    cache["local_v"] = incremental.write_cache(cache["local_v"], v, slot)
    cache["local_pos"] = incremental.write_cache(
        cache["local_pos"], tf.fill([tf.shape(q)[0], 1], position), slot, axis=1)
    return incremental.local_ring_step(
        q, cache["local_k"], cache["local_v"], cache["local_pos"][0], position,
        config.block_length, config.flange, relative_keys=rel_k, relative_values=rel_v,
        scale=1.0)
  return _attend(
      attention.local_attention, q, k, v, config.block_length, config.flange, causal=causal,
      relative_keys=rel_k, relative_values=rel_v, padding=None if causal else padding,
      scale=1.0, dropout_rate=dropout_rate)


def split_kinds(x, num_routing):
  """Heads [b, h, n, d] -> (the first `num_routing`, the others), None for an empty kind."""
  heads = x.shape[1]
  if not num_routing:
    return None, x
  if num_routing == heads:
    return x, None
  return tuple(tf.split(x, [num_routing, heads - num_routing], axis=1))


def kind_heads(routing, local, config, causal=True, padding=None, means=None,
               routing_tables=(None, None), local_tables=(None, None), routing_options=None,
               dropout_rate=0.0, cache=None, position=None):
  """All heads of a layer: (output [b, h, n, d], routing result or None). routing, local: (q, k,
  v) [b, heads of the kind, n, d] (q scaled) or None; means: [routing heads, c, d]; tables:
  (relative keys, values) [2R + 1, d] or Nones; cache, position: one decoding step's."""
  outputs, aux = [], None
  if routing is not None:
    out, aux = routing_heads_attention(*routing, means, config, causal, padding, routing_tables,
                                       routing_options, dropout_rate, cache, position)
    outputs.append(out)
  if local is not None:
    outputs.append(local_heads_attention(*local, config, causal, padding, local_tables,
                                         dropout_rate, cache, position))
  return (tf.concat(outputs, axis=1) if len(outputs) > 1 else outputs[0]), aux


def mixed_heads(q, k, v, num_routing, config, causal=True, padding=None, means=None,
                routing_tables=(None, None), local_tables=(None, None), routing_options=None,
                dropout_rate=0.0):
  """`kind_heads` of q, k, v [b, h, n, d] whose first `num_routing` heads route."""
  kinds = list(zip(*(split_kinds(x, num_routing) for x in (q, k, v))))  # [(q, k, v) per kind]
  routing, local = [None if kind[0] is None else kind for kind in kinds]
  return kind_heads(routing, local, config, causal, padding, means, routing_tables,
                    local_tables, routing_options, dropout_rate)
