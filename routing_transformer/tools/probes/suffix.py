"""Suffix identification (Sun et al., 2021, section 5), pure numpy.

A prefix ends at a sentence end; the candidates are the gold continuation (the next L = 128
tokens) and `negatives` = 5 spans of L tokens of the same book that start at sentence starts, lie
outside the prefix and the gold, and are disjoint from each other. The model is right when the
gold has the lowest perplexity (equivalently: the lowest mean NLL over its L tokens); chance is
1 / (1 + negatives). Accuracy is reported per prefix length P (the paper: 200, 512, 2K, 4K, 8K);
every P uses the same examples (the prefix is cut from the left).

Ties: when the gold shares the lowest mean NLL with t - 1 negatives (exact equality) the example
counts 1/t, the expected accuracy of a uniform tie-break; so a model scoring every candidate alike
gets exactly chance, and the credit never depends on candidate order.

Sentence ends come from the vocabulary: `sentence_end_table(encoder)` marks subword ids whose
decoded piece ends with '.', '!' or '?' (possibly followed by closing quotes, brackets and
whitespace). Any bool table over ids, or bool arrays per book, work the same.

Scoring goes through score_fn(inputs int32 [R, P + L], targets [R, L]) -> nll [R, L] (see
perturbations.py); the rows of one P have the same length, so they batch.
"""
import numpy as np

from routing_transformer.tools.probes import perturbations
from routing_transformer.tools.probes.errors import ProbeError

SUFFIX_LENGTH = 128
NEGATIVES = 5
TERMINALS = (".", "!", "?")
CLOSERS = "\"'\u201d\u2019)]\u00bb_ \t\r\n"  # closing quotes/brackets, T2T's escape '_', whitespace


def piece_ends_sentence(piece):
  """True when a decoded subword ends with '.', '!' or '?' before closing quotes/whitespace."""
  return piece.rstrip(CLOSERS).endswith(TERMINALS)


def decoded_piece(encoder, token_id):
  """The text of one subword id: encoder.decode([id]), else the raw subtoken string."""
  try:
    return encoder.decode([int(token_id)])
  except Exception:  # pylint: disable=broad-except
    strings = getattr(encoder, "_subtoken_id_to_subtoken_string", None)
    if strings is None or token_id >= len(strings):
      return ""
    return strings[token_id]


def sentence_end_table(encoder, vocab_size=None):
  """bool [vocab_size]: True for ids whose piece ends a sentence (T2T SubwordTextEncoder or any
  object with decode(list of ids) -> str); ids 0 (padding) and 1 (EOS) are False."""
  size = vocab_size or encoder.vocab_size
  table = np.array([piece_ends_sentence(decoded_piece(encoder, i)) for i in range(size)], bool)
  table[:min(2, size)] = False
  return table


def sentence_ends(book, table):
  """bool [len(book)]: book[i] ends a sentence (table: bool [vocab] over ids)."""
  book = np.asarray(book, np.int64)
  if book.size and book.max() >= len(table):
    raise ProbeError("token id %d is outside the sentence-end table (%d ids); build it from the "
                     "model's vocabulary" % (book.max(), len(table)))
  return np.asarray(table, bool)[book]


def sentence_starts(ends):
  """int64 positions q >= 1 whose previous token ends a sentence (ends: bool [n])."""
  return np.flatnonzero(np.asarray(ends, bool)[:-1]) + 1


def pick_negatives(starts, gold, max_prefix, length, book_length, count, rng):
  """`count` disjoint spans of `length` starting at sentence starts, outside
  [gold - max_prefix, gold + length); None when there are not enough. int64 [count], drawn in
  random order."""
  q = starts[(starts + length <= book_length) &
             ((starts + length <= gold - max_prefix) | (starts >= gold + length))]
  chosen = []
  for cand in rng.permutation(q):
    if all(cand + length <= c or cand >= c + length for c in chosen):
      chosen.append(int(cand))
      if len(chosen) == count:
        return np.array(chosen, np.int64)
  return None


def sample_suffix_examples(books, ends, num_examples, max_prefix, suffix_length=SUFFIX_LENGTH,
                           negatives=NEGATIVES, seed=0, max_tries=100):
  """Suffix-identification examples, deterministic in the seed.

  Books are drawn in proportion to their number of possible gold positions (sentence starts
  with at least max_prefix tokens before them and a full gold after them); no (book, gold) twice.

  Args:
    books: list of 1-D int arrays; ends: list of bool arrays (sentence_ends) per book.
    num_examples: E; max_prefix: the longest prefix length to be evaluated.
    suffix_length: L (128); negatives: per example (5); seed: int.
    max_tries: gold positions tried per example before giving up.
  Returns:
    int64 [E, 2 + negatives]: (book, gold start, negative starts...); the prefix of length
    P <= max_prefix is book[gold - P:gold].
  """
  rng = np.random.default_rng(int(seed))
  golds = []
  for book, book_ends in zip(books, ends):
    if len(book_ends) != len(book):
      raise ProbeError("sentence-end arrays must have one entry per token of their book")
    s = sentence_starts(book_ends)
    golds.append(s[(s >= max_prefix) & (s + suffix_length <= len(book))])
  counts = np.array([len(g) for g in golds], np.float64)
  if counts.sum() == 0:
    raise ProbeError("no sentence start has %d tokens before it and %d after it in any book; "
                     "lower the prefix length or use longer books" % (max_prefix, suffix_length))
  out, seen = [], set()
  for _ in range(num_examples):
    for _ in range(max_tries):
      book = int(rng.choice(len(books), p=counts / counts.sum()))
      gold = int(rng.choice(golds[book]))
      if (book, gold) in seen:
        continue
      negs = pick_negatives(sentence_starts(ends[book]), gold, max_prefix, suffix_length,
                            len(books[book]), negatives, rng)
      if negs is not None:
        seen.add((book, gold))
        out.append([book, gold] + list(negs))
        break
    else:
      raise ProbeError("found only %d of %d suffix examples (books too short for %d negatives "
                       "outside a %d-token prefix); lower the count or the prefix length"
                       % (len(out), num_examples, negatives, max_prefix))
  return np.array(out, np.int64).reshape(-1, 2 + negatives)


def candidate_inputs(books, example, prefix_length, suffix_length=SUFFIX_LENGTH):
  """int32 [1 + negatives, P + L]: the prefix followed by the gold (row 0) or a negative."""
  book, gold = int(example[0]), int(example[1])
  if gold < prefix_length:
    raise ProbeError("prefix length %d exceeds the %d tokens before the gold of book %d; sample "
                     "examples with max_prefix >= %d" % (prefix_length, gold, book, prefix_length))
  prefix = books[book][gold - prefix_length:gold]
  return np.stack([np.concatenate([prefix, books[book][s:s + suffix_length]])
                   for s in example[1:]]).astype(np.int32)


def identification_credit(mean_nll):
  """float64 [E]: 1/t when the gold (column 0) is among the t candidates with the lowest mean
  NLL, else 0 (mean_nll: [E, candidates])."""
  mean_nll = np.asarray(mean_nll, np.float64)
  best = mean_nll.min(axis=1, keepdims=True)
  tied = (mean_nll == best).sum(axis=1)
  return np.where(mean_nll[:, 0] == best[:, 0], 1.0 / tied, 0.0)


def run_suffix_identification(books, examples, prefix_lengths, score_fn,
                              suffix_length=SUFFIX_LENGTH, max_length=None, batch_examples=8,
                              progress=None):
  """Accuracy of picking the gold continuation, per prefix length.

  Args:
    books: list of 1-D int arrays; examples: from sample_suffix_examples.
    prefix_lengths: P values (each <= the max_prefix the examples were sampled with).
    score_fn: see the module docstring.
    suffix_length: L; max_length: the model's input length (P + L must fit), or None.
    batch_examples: examples per score_fn call ((1 + negatives) rows each).
    progress: optional callable(message) after each P.
  Returns:
    {"accuracy": {P: float}, "credit": {P: float64 [E]} (identification_credit),
     "mean_nll": {P: float64 [E, 1 + negatives]} (column 0 the gold)}.
  """
  examples = np.asarray(examples, np.int64)
  if examples.ndim != 2 or examples.shape[0] == 0 or examples.shape[1] < 3:
    raise ProbeError("examples must be [E >= 1, 2 + negatives] rows from sample_suffix_examples")
  result = {"accuracy": {}, "credit": {}, "mean_nll": {}}
  candidates = examples.shape[1] - 1
  for p in prefix_lengths:
    if p < 1:
      raise ProbeError("prefix length %d must be >= 1" % p)
    if max_length is not None and p + suffix_length > max_length:
      raise ProbeError("prefix %d + suffix %d exceeds the model's length %d; use prefix lengths "
                       "<= %d" % (p, suffix_length, max_length, max_length - suffix_length))
    targets = np.arange(p, p + suffix_length)
    means = np.zeros((len(examples), candidates), np.float64)
    for a in range(0, len(examples), batch_examples):
      chunk = examples[a:a + batch_examples]
      inputs = np.concatenate([candidate_inputs(books, e, p, suffix_length) for e in chunk])
      t = np.broadcast_to(targets, (len(inputs), suffix_length))
      nll = perturbations.score_rows(score_fn, inputs, t, len(inputs))
      means[a:a + len(chunk)] = nll.mean(axis=1).reshape(len(chunk), candidates)
    credit = identification_credit(means)
    result["mean_nll"][p], result["credit"][p] = means, credit
    result["accuracy"][p] = float(credit.mean())
    if progress:
      progress("suffix identification P=%d: accuracy %.3f over %d examples"
               % (p, result["accuracy"][p], len(examples)))
  return result
