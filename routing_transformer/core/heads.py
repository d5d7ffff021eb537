"""Multi-head plumbing shared by the T2T layers (`layers.py`) and the Keras layer (`keras.py`).

Splitting and combining heads, and the dispatch of one layer's heads to the attention functions:
routing heads first along the head axis, then local heads. One function per head kind serves
whole sequences and (with `cache`) one cached decoding step. Does not import Tensor2Tensor.

Shapes: x [b, n, h * d]; heads [b, h, n, d].
"""
import collections
import contextlib

import tensorflow as tf

from routing_transformer.core import attention
from routing_transformer.core import recompute
from routing_transformer.core.attention import incremental
from routing_transformer.core.attention import routing as routing_lib

HeadConfig = collections.namedtuple("HeadConfig", [
    "window", "block_length", "flange", "share_qk", "routing_mode", "random_routing",
    "legacy_causal_key_routing", "routing_padding_as_original", "recompute_attention"],
    defaults=(False, False))
HeadConfig.__doc__ = """How a layer's heads attend (the attention functions' static arguments).

window: members per routing cluster; block_length, flange: the local heads' blocks (query_shape,
memory_flange); share_qk, routing_mode ("topk" | "causal_window"), random_routing,
legacy_causal_key_routing, routing_padding_as_original (default False), recompute_attention
(default False: the heads keep their weights for the backward pass; True: the local heads'
attention and the routing heads' top-k cluster attention are recomputed there): as the hparams of
the same names.
"""


_OBSERVERS = []  # the active attention observers (`observing`)
_LAYER = []  # the index of the layer whose heads attend (`in_layer`)


@contextlib.contextmanager
def observing(observer):
  """While active, every attention call of the heads over whole sequences (not the cached
  decoding steps) also calls `observer(function, args, kwargs, result, layer)`: the attention
  function called (`attention.routing_attention`, `causal_window_attention` or
  `local_attention`), its arguments and result, and the layer index `in_layer` set (or None).
  The observer may call `function` itself, e.g. with other values (`tools.analysis` records each
  head's dense attention so)."""
  _OBSERVERS.append(observer)
  try:
    yield observer
  finally:
    _OBSERVERS.remove(observer)


@contextlib.contextmanager
def in_layer(index):
  """Marks the attention calls inside as layer `index`'s, for the observers (`observing`)."""
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
  """The routing heads: (output [b, hr, n, d], aux of the attention function).

  k is ignored (and may be None) when config.share_qk (keys are the queries); decoders with
  routing_mode="causal_window" use `causal_window_attention`, everything else (and every
  encoder) the paper's top-k routing. `options`: further keyword arguments of both functions
  (the extensions exclude_self, logit_scale). dropout_rate: attention dropout on the weights
  (TRAIN mode). dropout_rate, config.routing_padding_as_original and config.recompute_attention
  (top-k routing: the cluster attention recomputed in the backward pass) reach the functions only
  when set, so a call without them is the paper's call, keyword for keyword.

  With `cache` (one causal decoding step: q, k, v [b, hr, 1, d] of the int32 scalar `position`;
  no padding, no dropout), the query routes over the cached prefix with the decode-time rule
  ("topk": entries "routing_k" (normalised keys), "routing_v" [b, hr, N, d], "routing_scores"
  [b, hr, c, N]) or over its cluster's last `window` members ("causal_window": entry
  "routing_window", `incremental.causal_window_cache`), the entries are updated in place, and
  aux is None.
  """
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
  if causal and config.routing_mode == "causal_window":  # not recomputed
    return _attend(attention.causal_window_attention, q, k, v, means, config.window,
                   share_qk=config.share_qk, padding=padding, relative_keys=rel_k,
                   relative_values=rel_v, **options)
  if config.recompute_attention:
    options["recompute"] = True
  return _attend(
      attention.routing_attention, q, k, v, means, config.window, causal=causal,
      share_qk=config.share_qk, padding=padding, relative_keys=rel_k, relative_values=rel_v,
      random_routing=config.random_routing,
      legacy_causal_key_routing=config.legacy_causal_key_routing, **options)


def local_heads_attention(q, k, v, config, causal=True, padding=None, tables=(None, None),
                          dropout_rate=0.0, cache=None, position=None, after=()):
  """The local heads: blocked attention [b, hl, n, d] (unscaled: q carries d^-0.5), attention
  dropout `dropout_rate` on the weights. With config.recompute_attention the backward pass keeps
  only q, k, v and the tables and recomputes the attention (exact; refused with dropout), in
  groups of heads one after another in both passes (`head_groups`,
  `recompute.recompute_in_groups`), so one group's weights are alive at a time; `after` (the
  routing heads' output) orders the groups after the routing heads' attention in the forward
  pass and before its recomputation in the backward pass.

  With `cache` (one causal decoding step: q, k, v [b, hl, 1, d] of the int32 scalar `position`),
  the query attends over a ring of the last R >= flange + block positions (entries "local_k",
  "local_v" [b, hl, R, d], "local_pos" int32 [b, R], the position in each slot, -1 = empty),
  updated in place: [b, hl, 1, d].
  """
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
  pad = None if causal else padding

  def local(q, k, v, rel_k, rel_v, pad):
    return _attend(
        attention.local_attention, q, k, v, config.block_length, config.flange, causal=causal,
        relative_keys=rel_k, relative_values=rel_v, padding=pad, scale=1.0,
        dropout_rate=dropout_rate)

  if not config.recompute_attention:
    return local(q, k, v, rel_k, rel_v, pad)
  recompute.refuse_dropout(dropout_rate, "local_heads_attention")
  # the padding mask is not differentiable: closed over, not an input of the recomputation
  return recompute.recompute_in_groups(lambda *a: local(*a, pad), [q, k, v], [rel_k, rel_v],
                                       groups=head_groups(q.shape[1] or 1), after=after)


RECOMPUTE_HEADS_PER_GROUP = 2  # measured at bench-8k (6 local heads): 1, 2, 3 and 6 per group


def head_groups(heads):
  """How many groups `recompute_attention` runs `heads` local heads in, one group after the
  other: RECOMPUTE_HEADS_PER_GROUP heads each where they divide evenly, else one head each."""
  if heads % RECOMPUTE_HEADS_PER_GROUP:
    return heads
  return heads // RECOMPUTE_HEADS_PER_GROUP


def split_kinds(x, num_routing):
  """Heads [b, h, n, d] -> (the first `num_routing` [b, r, n, d], the others [b, h - r, n, d]),
  None for an empty kind. One tf.split (its gradient is one concat), not strided slices."""
  heads = x.shape[1]
  if not num_routing:
    return None, x
  if num_routing == heads:
    return x, None
  return tuple(tf.split(x, [num_routing, heads - num_routing], axis=1))


def kind_heads(routing, local, config, causal=True, padding=None, means=None,
               routing_tables=(None, None), local_tables=(None, None), routing_options=None,
               dropout_rate=0.0, cache=None, position=None):
  """All heads of a layer from the inputs of each kind: routing heads, then local heads.

  Args:
    routing, local: (q, k, v) of [b, heads of the kind, n, d] (q already scaled by d^-0.5;
      routing normalises it anyway), or None for a kind without heads; the routing k may be
      None with config.share_qk.
    config: HeadConfig.
    causal: decoder (True) or encoder (False) self-attention.
    padding: optional bool [b, n], True at padding positions.
    means: [routing heads, c, d] centroids (needed with routing heads).
    routing_tables, local_tables: (relative keys, relative values) [2R + 1, d] or Nones.
    routing_options: further keyword arguments of the routing attention functions.
    dropout_rate: attention dropout on the weights of every head (hparam `attention_dropout`;
      the caller passes 0 outside TRAIN mode).
    cache, position: None for whole sequences; for one causal decoding step (n = 1), the
      layer's caches (dict of both kinds' entries, see the kinds' functions; updated in place)
      and the int32 scalar position.
  Returns:
    (output [b, h, n, d], aux of the routing attention or None without routing heads or with
    `cache`).
  """
  outputs, aux = [], None
  if routing is not None:
    out, aux = routing_heads_attention(*routing, means, config, causal, padding, routing_tables,
                                       routing_options, dropout_rate, cache, position)
    outputs.append(out)
  if local is not None:
    outputs.append(local_heads_attention(*local, config, causal, padding, local_tables,
                                         dropout_rate, cache, position, after=list(outputs)))
  return (tf.concat(outputs, axis=1) if len(outputs) > 1 else outputs[0]), aux


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
  kinds = list(zip(*(split_kinds(x, num_routing) for x in (q, k, v))))  # [(q, k, v) per kind]
  routing, local = [None if kind[0] is None else kind for kind in kinds]
  return kind_heads(routing, local, config, causal, padding, means, routing_tables,
                    local_tables, routing_options, dropout_rate)
