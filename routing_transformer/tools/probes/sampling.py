"""The probe's inputs and targets, sampled once and shared by every prefix length, perturbation
and model.

An example is (book index, end, targets): the input of prefix length N is book[end - N:end]
(shorter N: the same end, tokens cut from the left) and the targets are absolute book positions
end + span (the paper: span [-50:-40], k = 10). Ends are drawn so that the longest input fits
in its book (end >= max N), hence every target exists at every N. Inputs are spread over books
proportionally to their length (largest remainder), ends uniformly without replacement within a
book, all from one numpy Generator seeded with `seed` (books in id order).
"""
import collections

import numpy as np

from routing_transformer.tools.probes.errors import ProbeError

Examples = collections.namedtuple("Examples", ["book", "end", "targets"])
Examples.__doc__ = """book int [E] (index into the book list), end int [E] (input end,
exclusive), targets int [E, k] (absolute book positions)."""


def parse_span(text):
  """"-50:-40" -> (-50, -40): offsets from the input's end, start inclusive, end exclusive."""
  try:
    start, end = (int(x) for x in str(text).split(":"))
  except ValueError:
    raise ProbeError("span %r: write START:END with negative offsets from the input's end, e.g. "
                     "-50:-40" % (text,))
  if not start < end <= 0:
    raise ProbeError("span %r: need START < END <= 0 (offsets from the input's end), e.g. -50:-40"
                     % (text,))
  return start, end


def check_span(span, length):
  """ProbeError unless the span lies inside an input of `length` tokens."""
  if -span[0] > length:
    raise ProbeError("span %d:%d reaches %d tokens back but the input has N=%d; use a shorter "
                     "span or larger N" % (span[0], span[1], -span[0], length))


def allocate(lengths, total):
  """Largest-remainder split of `total` inputs over books proportionally to `lengths`."""
  lengths = np.asarray(lengths, np.float64)
  share = total * lengths / lengths.sum()
  counts = np.floor(share).astype(np.int64)
  rest = total - counts.sum()
  order = np.argsort(-(share - counts), kind="stable")
  counts[order[:rest]] += 1
  return counts


def sample_examples(book_lengths, num_inputs, span, max_length, seed):
  """Examples of `num_inputs` inputs with targets at `span` (see module docstring).

  Args:
    book_lengths: tokens per book.
    num_inputs: E, inputs to draw.
    span: (start, end) offsets from the input's end, e.g. (-50, -40).
    max_length: the longest prefix length N that will be scored (every input fits it).
    seed: int.
  Returns:
    Examples sorted by (book, end).
  """
  check_span(span, max_length)
  lengths = np.asarray(book_lengths, np.int64)
  room = np.maximum(lengths - max_length + 1, 0)  # possible ends: max_length .. len
  if not room.any():
    raise ProbeError("no book has the %d tokens of the longest input (the longest has %d); "
                     "lower the largest N" % (max_length, lengths.max() if len(lengths) else 0))
  if num_inputs > room.sum():
    raise ProbeError("%d inputs asked but the books hold only %d distinct ones of %d tokens; ask "
                     "fewer targets" % (num_inputs, room.sum(), max_length))
  counts = allocate(np.where(room > 0, lengths, 0), num_inputs)
  counts = np.minimum(counts, room)  # tiny books: never more inputs than ends
  short = num_inputs - counts.sum()
  while short > 0:  # hand what tiny books could not take to the books with room left
    spare = np.flatnonzero(room > counts)
    counts[spare[np.argsort(-lengths[spare], kind="stable")[:short]]] += 1
    short = num_inputs - counts.sum()
  rng = np.random.default_rng(seed)
  books, ends = [], []
  for b, (n, r) in enumerate(zip(counts, room)):
    if n:
      books.append(np.full(n, b))
      ends.append(np.sort(max_length + rng.choice(r, size=n, replace=False)))
  book = np.concatenate(books).astype(np.int64)
  end = np.concatenate(ends).astype(np.int64)
  targets = end[:, None] + np.arange(span[0], span[1])[None, :]
  return Examples(book, end, targets)


def inputs(books, examples, length):
  """ids int32 [E, N] of every example's input of prefix length N = `length`."""
  out = np.zeros([len(examples.end), length], np.int32)
  for i, (b, e) in enumerate(zip(examples.book, examples.end)):
    out[i] = books[b][e - length:e]
  return out


def positions(examples, length, absolute=None):
  """Positions within the inputs of length N of absolute book positions (default: the
  targets): int [E, k] = absolute - (end - N)."""
  absolute = examples.targets if absolute is None else absolute
  return absolute - (examples.end[:, None] - length)


def as_rows(examples):
  """int64 [E, 2] rows (book index, end): the examples as perturbations.py takes them."""
  return np.stack([examples.book, examples.end], axis=1).astype(np.int64)
