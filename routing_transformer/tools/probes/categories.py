"""Token categories of the probe targets (Sun et al., 2021, section 4).

frequency: a target is frequent when its subword type is among the top `fraction` (10%) of the
  vocabulary's types ranked by count over a reference corpus (here: the probed books themselves,
  unless another set is given; ties broken by id, types never seen are never frequent).
word position: T2T's SubwordTextEncoder splits text into tokens (runs of alphanumeric characters,
  and runs of other characters; single spaces between two alphanumeric tokens are implied) and
  marks the end of each token by a trailing "_" on its last subword (`_escape_token`). A subword
  is "word_first" when it starts a token made of several subwords, "word_rest" when it continues
  one, "word_whole" when it is a token on its own.
distance: a target is "never" seen when its type does not occur before it in its full-length
  input, else "far" when its last previous occurrence there is more than `threshold` tokens back,
  else "near".
Every category is a property of the target in its full-length input (the input of the longest
prefix length probed; the paper's 8K), computed once and kept for every prefix length N, as Sun
et al. define them: each curve follows the same tokens as N grows (at N = 512 a "far" target's
last occurrence lies outside the prefix).
"""
import numpy as np

FREQUENCY = ("frequent", "infrequent")
WORD = ("word_first", "word_rest", "word_whole")
DISTANCE = ("near", "far", "never")


def frequent_types(corpus, vocab_size, fraction=0.1):
  """bool [V]: the top ceil(fraction * V) subword types of `corpus` (list of id arrays) by count."""
  counts = np.zeros(vocab_size, np.int64)
  for ids in corpus:
    counts += np.bincount(np.asarray(ids), minlength=vocab_size)[:vocab_size]
  top = int(np.ceil(fraction * vocab_size))
  order = np.lexsort((np.arange(vocab_size), -counts))[:top]  # by count, then id
  out = np.zeros(vocab_size, bool)
  out[order[counts[order] > 0]] = True
  return out


def word_ends(encoder):
  """bool [V]: the subword ends a T2T token (its escaped string ends with "_"), or None when
  the encoder has no subword strings (bytes, synthetic vocabularies)."""
  pieces = getattr(encoder, "all_subtoken_strings", None)
  if pieces is None:
    return None
  out = np.zeros(max(encoder.vocab_size, len(pieces)), bool)
  for i, piece in enumerate(pieces):
    out[i] = piece.endswith("_")
  return out


def word_position(ids, positions, ends):
  """Codes into WORD [..] of the subwords at `positions` of the id sequence `ids`.

  The subword before position 0 counts as a word end.
  """
  ids = np.asarray(ids)
  positions = np.asarray(positions)
  ends_here = ends[ids[positions]]
  before = np.where(positions > 0, ends[ids[np.maximum(positions - 1, 0)]], True)
  return np.where(~before, 1, np.where(ends_here, 2, 0))


def previous_occurrence(ids):
  """int [n]: for every position the last earlier position with the same id, -1 if none."""
  ids = np.asarray(ids)
  order = np.argsort(ids, kind="stable")
  out = np.full(len(ids), -1, np.int64)
  same = ids[order[1:]] == ids[order[:-1]]
  out[order[1:][same]] = order[:-1][same]
  return out


def distance_category(distance, prefix, threshold):
  """Codes into DISTANCE: distance to the last occurrence (-1: none), prefix = tokens of the
  input before the target; far when distance > threshold."""
  distance = np.asarray(distance)
  never = (distance < 0) | (distance > np.asarray(prefix))
  return np.where(never, 2, np.where(distance > threshold, 1, 0))
