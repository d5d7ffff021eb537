"""Long-range retrieval in one content-addressed hop: a family of synthetic LM problems.

A sequence of `length` tokens (`Layout`):

  positions 0 .. I-1         I items [k, v]: one token each, key k (distinct, random), value v
  positions I .. n-2Q-1      filler counting modulo NUM_FILLERS
  positions n-2Q .. n-1      Q queries: the query token ?k of a stored key, then its item [k, v]

The target after each query token ("far" position, metric `far_accuracy`) is the item [k, v]
stored at the start. An item is ONE token carrying both its key and its value, so the query
position finds the answer in one hop: attention from ?k to the position whose token is [k, *]
(content: the key), copying that token. Nothing needs an earlier layer: the matched position's
own token is the answer. (In the older `synthetic_long_range`, "v k ... k -> v", the matched key's
position does not hold the value; a previous-token head must first copy v into it, an induction
circuit that tiny models learn only after thousands of steps.) The value is random, so a model
that knows the key but cannot look it up is at chance 1 / num_values on the far positions.

Every query's item lies at least `min_far_distance` positions back; `check_layout` refuses a
layout that cannot hold its items or whose far items a model's non-routing heads could reach
(`routing_transformer.core.cost.local_receptive_field`), with one line naming the fix.
Ids: 0 padding, 1 EOS (unused), then query tokens, items, fillers.

`MixedLayout` mixes near and far look-ups in one sequence: each of `num_pairs` items sits
somewhere in the filler and its query comes a distance drawn from one of `bands` later (the
bands take turns, so every band holds the same share of look-ups). Near look-ups teach the
content match that far ones reuse; the metric is accuracy per distance band, and near/far split
at the model's local reach.
"""
import collections

import numpy as np
import tensorflow.compat.v1 as tf

from tensor2tensor.data_generators import text_encoder
from tensor2tensor.layers import modalities
from tensor2tensor.utils import registry

from problems import synthetic
from routing_transformer.core import cost

PAD_ID = 0
EOS_ID = 1
NUM_RESERVED = 2
NUM_FILLERS = 8
TRAIN_SEED = 11
EVAL_SEED = 12


class LayoutError(ValueError):
  """A layout that cannot hold its items, or that a model could solve without a far hop."""
  one_line = True  # printed as one line by the stock binaries (routing_transformer.t2t.glue)


class _Vocabulary(object):
  """Ids shared by both layouts: query tokens ?k, items [k, v], fillers."""

  @property
  def query_token_start(self):
    return NUM_RESERVED

  @property
  def item_start(self):
    return NUM_RESERVED + self.num_keys

  @property
  def filler_start(self):
    return self.item_start + self.num_keys * self.num_values

  @property
  def vocab_size(self):
    return self.filler_start + NUM_FILLERS

  def item(self, key, value):
    return self.item_start + key * self.num_values + value


class Layout(_Vocabulary, collections.namedtuple(
    "Layout", ["length", "num_items", "num_queries", "num_keys", "num_values"])):
  """`num_items` stored items (distinct keys of `num_keys`, values of `num_values`), a filler,
  then `num_queries` queries of distinct stored keys, each followed by its item."""

  @property
  def query_start(self):
    return self.length - 2 * self.num_queries

  @property
  def filler_length(self):
    return self.query_start - self.num_items

  @property
  def min_far_distance(self):
    """Smallest distance from a query token to the stored item it needs."""
    return self.query_start - (self.num_items - 1)

  def far_positions(self):
    """Target positions of the items in the query section (each needs the far look-up)."""
    return [self.query_start + 2 * i + 1 for i in range(self.num_queries)]


def check_layout(layout, hparams=None):
  """Raises LayoutError (one line naming the fix) unless `layout` holds its items and queries;
  with model `hparams`, also unless the model's static length holds the sequence and its
  non-routing heads cannot reach the stored items from the query tokens."""
  name = "retrieval layout %s" % (tuple(layout),)
  if layout.num_keys < 1 or layout.num_values < 2:
    raise LayoutError("%s: needs num_keys >= 1 and num_values >= 2." % name)
  if not 1 <= layout.num_items <= layout.num_keys:
    raise LayoutError("%s: %d items need %d distinct keys; use num_keys >= %d or fewer items."
                      % (name, layout.num_items, layout.num_items, max(layout.num_items, 1)))
  if not 1 <= layout.num_queries <= layout.num_items:
    raise LayoutError("%s: each query asks a distinct stored key; use 1 <= num_queries <= "
                      "num_items = %d." % (name, layout.num_items))
  if layout.filler_length < 0:
    raise LayoutError("%s: %d items + %d query tokens do not fit in %d tokens; use length >= %d."
                      % (name, layout.num_items, 2 * layout.num_queries, layout.length,
                         layout.num_items + 2 * layout.num_queries))
  if hparams is None:
    return
  model_length = cost.length_of(hparams)
  if layout.length > model_length:
    raise LayoutError("%s: the model's static length is %d; use --hparams=max_length=%d,"
                      "max_target_length=%d (and batch_size a multiple of it)."
                      % (name, model_length, layout.length, layout.length))
  if hparams.get("full_attention", False):
    return  # the ceiling: its heads are meant to reach everything
  reach = cost.local_receptive_field(hparams, model_length)
  if layout.min_far_distance <= reach:
    raise LayoutError(
        "%s: the model's local heads reach %d positions back (query_shape %d - 1 + layers x "
        "memory_flange %d) and the nearest far item is only %d back; use length >= %d or "
        "smaller query_shape/memory_flange." % (
            name, reach, hparams.query_shape[0],
            hparams.memory_flange[0], layout.min_far_distance,
            reach + layout.num_items + 2 * layout.num_queries))


def generate_samples(seed, num, layout):
  """Returns `num` int64 sequences [num, layout.length], a pure function of (seed, layout)."""
  check_layout(layout)
  rng = np.random.default_rng(seed)
  keys = np.argsort(rng.random((num, layout.num_keys)), axis=1)[:, :layout.num_items]
  values = rng.integers(0, layout.num_values, size=(num, layout.num_items))
  items = layout.item(keys, values)
  asked = np.argsort(rng.random((num, layout.num_items)), axis=1)[:, :layout.num_queries]
  queries = layout.query_token_start + np.take_along_axis(keys, asked, axis=1)
  answers = np.take_along_axis(items, asked, axis=1)
  query_section = np.stack([queries, answers], axis=-1).reshape(num, -1)
  filler = layout.filler_start + np.arange(layout.filler_length) % NUM_FILLERS
  filler = np.broadcast_to(filler, (num, layout.filler_length))
  return np.concatenate([items, filler, query_section], axis=1).astype(np.int64)


class MixedLayout(_Vocabulary, collections.namedtuple(
    "MixedLayout", ["length", "num_pairs", "num_keys", "num_values", "bands"])):
  """`num_pairs` look-ups (distinct keys of `num_keys`, values of `num_values`) in a filler of
  `length` tokens: an item [k, v] at p, later the query ?k at q = p + d and its item at q + 1,
  with d drawn from `bands` ((lo, hi) inclusive, taken in turn: equal shares)."""

  def band_name(self, band):
    return "d%d_%d" % tuple(band)


def check_mixed_layout(layout, hparams=None):
  """Raises LayoutError (one line naming the fix) unless the look-ups fit in `layout.length`."""
  name = "retrieval layout %s" % (tuple(layout),)
  if layout.num_keys < 1 or layout.num_values < 2:
    raise LayoutError("%s: needs num_keys >= 1 and num_values >= 2." % name)
  if not 1 <= layout.num_pairs <= layout.num_keys:
    raise LayoutError("%s: %d look-ups need %d distinct keys; use num_keys >= %d."
                      % (name, layout.num_pairs, layout.num_pairs, layout.num_pairs))
  if not layout.bands:
    raise LayoutError("%s: needs at least one distance band (lo, hi)." % name)
  for lo, hi in layout.bands:
    if not 1 <= lo <= hi <= layout.length - 2:
      raise LayoutError("%s: band (%d, %d) must satisfy 1 <= lo <= hi <= length - 2 = %d."
                        % (name, lo, hi, layout.length - 2))
  if 6 * layout.num_pairs > layout.length:
    raise LayoutError("%s: %d look-ups (3 tokens each) crowd %d tokens; use length >= %d or "
                      "num_pairs <= %d." % (name, layout.num_pairs, layout.length,
                                            6 * layout.num_pairs, layout.length // 6))
  if hparams is not None and layout.length > cost.length_of(hparams):
    raise LayoutError("%s: the model's static length is %d; use --hparams=max_length=%d,"
                      "max_target_length=%d (and batch_size a multiple of it)."
                      % (name, cost.length_of(hparams), layout.length, layout.length))


def generate_mixed_samples(seed, num, layout, with_distances=False):
  """`num` int64 sequences [num, length], a pure function of (seed, layout); with
  `with_distances` also [num, length] int64: d at each look-up's answer position, else -1."""
  check_mixed_layout(layout)
  rng = np.random.default_rng(seed)
  n, bands = layout.length, layout.bands
  seqs = np.broadcast_to(layout.filler_start + np.arange(n) % NUM_FILLERS, (num, n)).copy()
  dists = np.full((num, n), -1, np.int64)
  for s in range(num):
    free = np.ones(n, bool)
    keys = rng.permutation(layout.num_keys)[:layout.num_pairs]
    values = rng.integers(0, layout.num_values, size=layout.num_pairs)
    band_of = rng.permutation(np.arange(layout.num_pairs) % len(bands))
    for key, value, b in zip(keys, values, band_of):
      lo, hi = bands[b]
      for _ in range(1000):
        d = int(rng.integers(lo, hi + 1))
        q = int(rng.integers(d, n - 1))  # query ?k at q, its answer at q + 1 <= n - 1
        if free[q - d] and free[q] and free[q + 1]:
          break
      else:
        raise LayoutError("retrieval layout %s: no free place for a look-up at distance %d-%d "
                          "after 1000 draws; use fewer pairs or a longer sequence."
                          % (tuple(layout), lo, hi))
      free[[q - d, q, q + 1]] = False
      seqs[s, q - d] = seqs[s, q + 1] = layout.item(key, value)
      seqs[s, q] = layout.query_token_start + key
      dists[s, q + 1] = d
  return (seqs, dists) if with_distances else seqs


def answer_distances(seqs, layout):
  """[num, length] int64 from the tokens alone: at each answer position (after a query token)
  the distance from the query token back to its item, else -1 (numpy twin of the metric's)."""
  seqs = np.asarray(seqs)
  out = np.full(seqs.shape, -1, np.int64)
  for s, row in enumerate(seqs):
    is_query = (row >= layout.query_token_start) & (row < layout.item_start)
    for q in np.nonzero(is_query[:-1])[0]:
      earlier = np.nonzero(row[:q] == row[q + 1])[0]
      if earlier.size:
        out[s, q + 1] = q - earlier[-1]
  return out


def _answer_distances_tf(labels, layout):
  """TF version of `answer_distances` for labels [batch, length] (int)."""
  labels = tf.cast(labels, tf.int32)
  n = tf.shape(labels)[1]
  prev = tf.pad(labels[:, :-1], [[0, 0], [1, 0]])
  after_query = (prev >= layout.query_token_start) & (prev < layout.item_start)
  i = tf.range(n)
  before_query = i[None, :] < i[:, None] - 1  # [i, j]: j < i - 1
  same = tf.equal(labels[:, :, None], labels[:, None, :]) & before_query[None]
  last = tf.reduce_max(tf.where(same, tf.broadcast_to(i[None, None, :], tf.shape(same)),
                                -tf.ones_like(same, tf.int32)), axis=-1)
  return tf.where(after_query & (last >= 0), i[None, :] - 1 - last, -tf.ones_like(last))


def band_accuracy(predictions, labels, weights_fn=None, layout=None, lo=1, hi=1 << 30):
  """Accuracy on the answers of look-ups at distance lo..hi (T2T metric: scores, weights)."""
  with tf.variable_scope("band_accuracy", values=[predictions, labels]):
    correct, weights, labels = synthetic.token_accuracy(predictions, labels, weights_fn)
    flat = tf.reshape(labels, [tf.shape(labels)[0], tf.shape(labels)[1]])
    d = _answer_distances_tf(flat, layout)
    hit = tf.cast((d >= lo) & (d <= hi), tf.float32)
    return correct, weights * tf.reshape(hit, tf.shape(weights))


def _band_metric(layout, lo, hi):
  def fn(predictions, labels, weights_fn=None):
    return band_accuracy(predictions, labels, weights_fn, layout, lo, hi)
  return fn


def mixed_metric_fns(layout, hparams=None):
  """{name: metric}: accuracy per band; with model hparams also near_accuracy (d <= the local
  heads' reach; full attention: the reach of its query_shape / memory_flange, so every model
  splits at the same distance) and far_accuracy (d > reach)."""
  fns = {"accuracy_" + layout.band_name(b): _band_metric(layout, *b) for b in layout.bands}
  if hparams is not None and "query_shape" in hparams.values():
    reach = cost.local_receptive_field(hparams, cost.length_of(hparams), as_local=True)
    fns["near_accuracy"] = _band_metric(layout, 1, reach)
    fns["far_accuracy"] = _band_metric(layout, reach + 1, layout.length)
  return fns


class RetrievalEncoder(text_encoder.TextEncoder):
  """Readable ids: ?3 (query of key 3), k3v5 (item), f2 (filler), <pad>, <EOS>."""

  def __init__(self, layout):
    super().__init__(num_reserved_ids=NUM_RESERVED)
    self.layout = layout

  @property
  def vocab_size(self):
    return self.layout.vocab_size

  def token_name(self, i):
    i, l = int(i), self.layout
    if i == PAD_ID:
      return "<pad>"
    if i == EOS_ID:
      return "<EOS>"
    if l.query_token_start <= i < l.item_start:
      return "?%d" % (i - l.query_token_start)
    if l.item_start <= i < l.filler_start:
      return "k%dv%d" % divmod(i - l.item_start, l.num_values)
    if l.filler_start <= i < l.vocab_size:
      return "f%d" % (i - l.filler_start)
    raise ValueError("Id %d is outside the retrieval vocabulary [0, %d)." % (i, l.vocab_size))

  def token_id(self, name):
    l = self.layout
    names = {"<pad>": PAD_ID, "<EOS>": EOS_ID}
    if name in names:
      return names[name]
    try:
      if name.startswith("?"):
        key = int(name[1:])
        if 0 <= key < l.num_keys:
          return l.query_token_start + key
      elif name.startswith("k") and "v" in name:
        key, value = (int(x) for x in name[1:].split("v"))
        if 0 <= key < l.num_keys and 0 <= value < l.num_values:
          return l.item(key, value)
      elif name.startswith("f"):
        filler = int(name[1:])
        if 0 <= filler < NUM_FILLERS:
          return l.filler_start + filler
    except ValueError:
      pass
    raise ValueError("Unknown retrieval token %r; expected ?K, kKvV, fF, <pad> or <EOS> with K < "
                     "%d, V < %d, F < %d." % (name, l.num_keys, l.num_values, NUM_FILLERS))

  def encode(self, s):
    return [self.token_id(name) for name in s.split()]

  def decode(self, ids, strip_extraneous=False):
    if strip_extraneous:
      ids = text_encoder.strip_ids(ids, list(range(NUM_RESERVED)))
    return " ".join(self.decode_list(ids))

  def decode_list(self, ids):
    return [self.token_name(i) for i in np.asarray(ids).reshape([-1])]


class LongRangeRetrieval(synthetic.GeneratedSequences):
  """Base of the registered layouts; subclasses set `layout`."""

  num_eval = 500
  seeds = (TRAIN_SEED, EVAL_SEED)
  generate = staticmethod(generate_samples)

  def feature_encoders(self, data_dir):
    del data_dir
    return {"targets": RetrievalEncoder(self.layout)}

  def hparams(self, defaults, model_hparams):
    if model_hparams is not None and "query_shape" in model_hparams.values():
      check_layout(self.layout, model_hparams)
    defaults.modality = {"targets": modalities.ModalityType.SYMBOL}
    defaults.vocab_size = {"targets": self.layout.vocab_size}

  def example_reading_spec(self):
    return {"targets": tf.VarLenFeature(tf.int64)}, None

  def eval_metric_fns(self, model_hparams):
    metric_fns = dict(super().eval_metric_fns(model_hparams))
    metric_fns["far_accuracy"] = synthetic.layout_metric(synthetic.far_accuracy, self.layout)
    metric_fns["near_accuracy"] = synthetic.layout_metric(synthetic.near_accuracy, self.layout)
    return metric_fns


class MixedRetrieval(LongRangeRetrieval):
  """Base of the registered mixed layouts (near and far look-ups in one sequence)."""

  generate = staticmethod(generate_mixed_samples)

  def hparams(self, defaults, model_hparams):
    if model_hparams is not None and "query_shape" in model_hparams.values():
      check_mixed_layout(self.layout, model_hparams)
    defaults.modality = {"targets": modalities.ModalityType.SYMBOL}
    defaults.vocab_size = {"targets": self.layout.vocab_size}

  def eval_metric_fns(self, model_hparams):
    metric_fns = dict(super(LongRangeRetrieval, self).eval_metric_fns(model_hparams))
    metric_fns.update(mixed_metric_fns(self.layout, model_hparams))
    return metric_fns


LAYOUTS = {
    # name: Layout(length, items, queries, keys, values)
    "long_range_retrieval_1k": Layout(1024, 16, 16, 16, 8),
    "long_range_retrieval_1k_items64": Layout(1024, 64, 64, 64, 4),
    "long_range_retrieval_2k": Layout(2048, 16, 16, 16, 8),
    "long_range_retrieval_4k": Layout(4096, 32, 32, 32, 8),
    # Near and far mixed: MixedLayout(length, pairs, keys, values, bands); the bands split at
    # 64 and at the tiny1k sets' local reach (191 = 63 + 2 x 64).
    "long_range_retrieval_256_mixed": MixedLayout(256, 16, 16, 8, ((2, 32), (33, 250))),
    "long_range_retrieval_1k_mixed": MixedLayout(
        1024, 32, 32, 8, ((2, 64), (65, 191), (192, 1000))),
    "long_range_retrieval_4k_mixed": MixedLayout(
        4096, 64, 64, 8, ((2, 64), (65, 191), (192, 1000), (1001, 4000))),
}


def _register(name, layout):
  base = MixedRetrieval if isinstance(layout, MixedLayout) else LongRangeRetrieval
  cls = type("LongRangeRetrieval_" + name, (base,), {
      "layout": layout, "__doc__": "One-hop retrieval, layout %s." % (tuple(layout),)})
  registry.register_problem(name)(cls)
  return cls


for _name, _layout in sorted(LAYOUTS.items()):
  _register(_name, _layout)
