"""Perturbation and sequence-copy probes of Sun et al. (2021), pure numpy.

Token-level examples: `books` is a list of 1-D int arrays of token ids (one per book) and an
example is a row (book index, end e) of `examples` [B, 2]: its input is book[e - N:e] and its K
targets sit at fixed positions of the input (default N-50..N-41, the paper's [-50:-40]).

Every probe changes the input only where documented and leaves the targets alone; every runner
scores through

    score_fn(inputs int32 [B, N], targets int [B, K]) -> nll float64 [B, K]
        (-log p(inputs[b, p] | inputs[b, :p]) in nats, one forward pass per row)

and returns the NLL arrays, so the caller computes perplexity exp(scale * mean NLL) and bootstrap
intervals. Randomness is drawn per (seed, kind, m, run, row), so results do not depend on the
batch size, the order of m or which kinds run, and are the same for every model.

Perturbations of the first m tokens (`perturb`): "shuffle" them; "replace" them with a random
m-token span of another book; "drop" (set to `pad_id`) the prefix tokens whose next occurrence in
the input is a target; "drop_control" drops as many uniformly random tokens of the first m.
Sequence copy (`copy_targets`): the targets (and optionally `context` tokens before them) are
inserted so that the copy of every target sits exactly d tokens before it; docs/probes.md.

Id 0 inside an input (the default pad_id, as the paper's "replace with padding") is not ignored by
this model: it is embedded with the trained row 0 (the start symbol), and the position whose
target is 0 is masked as a key by the routing heads (not by the local heads); the original
release only embeds it. The drop control uses the same mechanics, so drop vs control stays fair;
research/notes/probes_end_of_input.md ("what id 0 does inside an input").
"""
import numpy as np

from routing_transformer.tools.probes.errors import ProbeError

KINDS = ("shuffle", "replace", "drop", "drop_control")
DETERMINISTIC = ("drop",)  # scored once: the runs axis of their NLL arrays has length 1
PAD_ID = 0
DROP_RULES = ("next", "any")
_KIND_CODE = {kind: i for i, kind in enumerate(KINDS)}


def example_inputs(books, examples, n):
  """Inputs of token-level examples.

  Args:
    books: list of 1-D int arrays.
    examples: int [B, 2] rows (book index, end e).
    n: input length N.
  Returns:
    int32 [B, N]: row b is books[book_b][e_b - N:e_b].
  """
  examples = np.asarray(examples, np.int64).reshape(-1, 2)
  out = np.zeros([len(examples), n], np.int32)
  for row, (book, end) in enumerate(examples):
    if not 0 <= book < len(books):
      raise ProbeError("example %d names book %d but there are %d books; sample examples from "
                       "these books" % (row, book, len(books)))
    if not n <= end <= len(books[book]):
      raise ProbeError("example %d (book %d, end %d) needs %d <= end <= %d for N=%d; sample ends "
                       "at least N tokens into the book" % (row, book, end, n, len(books[book]), n))
    out[row] = books[book][end - n:end]
  return out


def target_matrix(targets, batch, n):
  """Targets as int64 [batch, K] absolute positions in [0, N) from [K] or [B, K] (negative
  positions count from the end, as in the paper's [-50:-40])."""
  t = np.asarray(targets, np.int64)
  t = np.where(t < 0, t + n, t)
  if t.ndim == 1:
    t = np.broadcast_to(t, (batch, t.shape[0]))
  if t.ndim != 2 or t.shape[0] != batch or t.shape[1] == 0:
    raise ProbeError("targets must be [K] or [B=%d, K] positions, got shape %s"
                     % (batch, np.shape(targets)))
  if t.min() < 1 or t.max() >= n:
    raise ProbeError("target positions must lie in 1..N-1=%d (got %d..%d); use a target span "
                     "inside the input" % (n - 1, t.min(), t.max()))
  return t


def check_prefix_length(m, targets):
  """Refuses an m that is not in 1..first target position ([B, K] targets)."""
  first = int(np.min(targets))
  if not 1 <= m <= first:
    raise ProbeError("m=%d must be in 1..%d so that only tokens before the first target (position "
                     "%d) change; lower m" % (m, first, first))


def row_rng(seed, kind, m, run, row):
  """The generator of one perturbed row (independent of batching and of the other kinds)."""
  return np.random.default_rng([int(seed), _KIND_CODE[kind], int(m), int(run), int(row)])


def shuffle_prefix(row, m, rng):
  """row [N] with row[:m] randomly permuted (the rest untouched)."""
  out = np.array(row, copy=True)
  out[:m] = rng.permutation(out[:m])
  return out


def random_span(books, book, m, rng):
  """(other book, start) of a uniformly random m-token span among all books but `book`."""
  others = [i for i in range(len(books)) if i != book and len(books[i]) >= m]
  if not others:
    raise ProbeError("replace needs another book of at least m=%d tokens; add books or lower m"
                     % m)
  spans = np.array([len(books[i]) - m + 1 for i in others], np.float64)
  other = others[rng.choice(len(others), p=spans / spans.sum())]
  return other, int(rng.integers(0, len(books[other]) - m + 1))


def replace_prefix(row, m, span):
  """row [N] with row[:m] replaced by `span` (m tokens)."""
  out = np.array(row, copy=True)
  out[:m] = span
  return out


def next_occurrence(row):
  """int64 [N]: for every position j the smallest p > j with row[p] == row[j], else -1."""
  row = np.asarray(row)
  order = np.argsort(row, kind="stable")  # equal tokens stay in position order
  same = row[order[1:]] == row[order[:-1]]
  out = np.full(row.shape[0], -1, np.int64)
  out[order[:-1][same]] = order[1:][same]
  return out


def drop_mask(row, targets_row, m, rule="next"):
  """bool [N], True at the positions j < m to drop.

  rule "next" (the paper's): the next occurrence of row[j] in the input is a target position;
  "any": row[j] equals the token of some target.
  """
  mask = np.zeros(len(row), bool)
  if rule == "next":
    mask[:m] = np.isin(next_occurrence(row)[:m], targets_row)
  elif rule == "any":
    mask[:m] = np.isin(row[:m], row[targets_row])
  else:
    raise ProbeError("drop_rule=%r is not supported; use one of %s" % (rule, ", ".join(DROP_RULES)))
  return mask


def control_mask(n, m, count, targets_row, rng):
  """bool [N] with `count` uniformly random positions among the first m (never a target)."""
  allowed = np.setdiff1d(np.arange(m), targets_row)
  if count > len(allowed):
    raise ProbeError("the drop control needs %d positions before m=%d; raise m" % (count, m))
  mask = np.zeros(n, bool)
  mask[rng.choice(allowed, size=count, replace=False)] = True
  return mask


def apply_drop(row, mask, pad_id=PAD_ID):
  """row [N] with the masked positions set to pad_id."""
  out = np.array(row, copy=True)
  out[mask] = pad_id
  return out


def perturb(kind, row, targets_row, m, rng, books=None, book=None, pad_id=PAD_ID,
            drop_rule="next"):
  """One perturbed input.

  Args:
    kind: one of KINDS.
    row: int [N] input; targets_row: int [K] target positions (all >= m).
    m: number of leading tokens perturbed.
    rng: np.random.Generator (row_rng).
    books, book: the books and the row's own book ("replace" draws from the others).
    pad_id: id written by "drop" and "drop_control".
    drop_rule: "next" or "any" (drop_mask).
  Returns:
    (int [N] perturbed input, number of dropped tokens (0 for shuffle/replace)).
  """
  if kind == "shuffle":
    return shuffle_prefix(row, m, rng), 0
  if kind == "replace":
    other, start = random_span(books, book, m, rng)
    return replace_prefix(row, m, books[other][start:start + m]), 0
  if kind not in ("drop", "drop_control"):
    raise ProbeError("perturbation %r is not supported; use one of %s" % (kind, ", ".join(KINDS)))
  mask = drop_mask(row, targets_row, m, drop_rule)
  count = int(mask.sum())
  if kind == "drop_control":
    mask = control_mask(len(row), m, count, targets_row, rng)
  return apply_drop(row, mask, pad_id), count


def score_rows(score_fn, inputs, targets, batch_rows):
  """score_fn over row chunks of at most batch_rows: float64 [B, K]; checks the returned shape."""
  out = np.zeros(targets.shape, np.float64)
  for a in range(0, len(inputs), batch_rows):
    part = np.asarray(score_fn(inputs[a:a + batch_rows], targets[a:a + batch_rows]), np.float64)
    if part.shape != targets[a:a + batch_rows].shape:
      raise ProbeError("score_fn returned shape %s for targets of shape %s; it must return one "
                       "NLL per target" % (part.shape, targets[a:a + batch_rows].shape))
    out[a:a + batch_rows] = part
  return out


def run_perturbations(books, examples, n, targets, score_fn, m_list, runs=5, seed=0,
                      kinds=KINDS, pad_id=PAD_ID, drop_rule="next", batch_rows=64,
                      progress=None):
  """Scores the targets of every example unperturbed and under every (kind, m, run).

  Inputs are built batch_rows at a time, so memory stays O(batch_rows * N) for any B.

  Args:
    books: list of 1-D int arrays; examples: int [B, 2] (book, end); n: input length N.
    targets: [K] or [B, K] target positions in the input (negative: from the end).
    score_fn: see the module docstring.
    m_list: numbers of leading tokens perturbed (each <= the first target position).
    runs: repetitions of the random kinds (the paper: 5); "drop" is deterministic (1 run).
    seed: int; kinds: subset of KINDS; pad_id: the dropped tokens' id; drop_rule: drop_mask.
    batch_rows: rows per score_fn call.
    progress: optional callable(message) called after each (kind, m).
  Returns:
    {"baseline": float64 [B, K],
     "nll": {kind: {m: float64 [R, B, K]}} (R = runs, 1 for "drop"),
     "dropped": {m: int64 [B]} tokens dropped per row by "drop" (and by its control),
     "targets": int64 [B, K] absolute positions}.
  """
  examples = np.asarray(examples, np.int64).reshape(-1, 2)
  t = target_matrix(targets, len(examples), n)
  for kind in kinds:
    if kind not in KINDS:
      raise ProbeError("perturbation %r is not supported; use some of %s" % (kind, ", ".join(KINDS)))
  if runs < 1:
    raise ProbeError("runs=%d must be >= 1" % runs)
  for m in m_list:
    check_prefix_length(m, t)
  chunks = [slice(a, a + batch_rows) for a in range(0, len(examples), batch_rows)]
  baseline = np.zeros(t.shape, np.float64)
  for rows in chunks:
    baseline[rows] = score_rows(score_fn, example_inputs(books, examples[rows], n), t[rows],
                                batch_rows)
  result = {"baseline": baseline, "nll": {}, "dropped": {}, "targets": t}
  for kind in kinds:
    result["nll"][kind] = {}
    for m in m_list:
      reps = 1 if kind in DETERMINISTIC else runs
      nll = np.zeros((reps,) + t.shape, np.float64)
      counts = np.zeros(len(examples), np.int64)
      for run in range(reps):
        for rows in chunks:
          inputs = example_inputs(books, examples[rows], n)
          for i, b in enumerate(range(len(examples))[rows]):
            inputs[i], counts[b] = perturb(kind, inputs[i], t[b], m,
                                           row_rng(seed, kind, m, run, b), books,
                                           examples[b, 0], pad_id, drop_rule)
          nll[run, rows] = score_rows(score_fn, inputs, t[rows], batch_rows)
      if kind in ("drop", "drop_control"):
        result["dropped"][m] = counts
      result["nll"][kind][m] = nll
      if progress:
        progress("perturbation %s m=%d: %d runs x %d inputs" % (kind, m, reps, len(examples)))
  return result


def check_distance(d, targets_row, context=0):
  """Refuses a copy distance outside [span of the targets, first target - context]."""
  first, last = int(np.min(targets_row)), int(np.max(targets_row))
  span = last - first + 1
  if d > first - context:
    raise ProbeError("copy distance d=%d exceeds the %d tokens before the first target (context "
                     "%d); use d <= %d or a longer input" % (d, first, context, first - context))
  if d < span:
    raise ProbeError("copy distance d=%d is shorter than the copied targets (%d tokens), so the "
                     "copy would overlap them; use d >= %d" % (d, span, span))


def copy_targets(row, targets_row, d, context=0):
  """Inserts a copy of the target sequence d tokens before it, keeping the length N.

  The copied span is row[first - context:last + 1] (the targets from the first to the last and
  `context` tokens before them), L tokens. It is inserted at position s = first - context - d:
  tokens before s move L places left (the L leftmost tokens fall off) and tokens from
  s + L = last + 1 - d on are unchanged, so new[t - d] == row[t] for every target t, and the
  targets, the d - (last - first + 1) tokens before them and everything after them are untouched.
  Insertion rather than overwriting keeps every token near the targets (overwriting would erase
  L tokens of local context at small d, mixing the copy's effect with a loss of context).

  Args:
    row: int [N]; targets_row: int [K] target positions; d: distance; context: tokens >= 0.
  Returns:
    int [N].
  """
  check_distance(d, targets_row, context)
  first, last = int(np.min(targets_row)), int(np.max(targets_row))
  span = row[first - context:last + 1]
  length = len(span)
  start = first - context - d
  out = np.array(row, copy=True)
  out[:start] = row[length:start + length]
  out[start:start + length] = span
  return out


def copy_distances(first_target, context=0, smallest=64):
  """The paper's distances: powers of two from `smallest` up to the longest possible distance,
  and that distance (first_target - context)."""
  longest = first_target - context
  out = []
  d = smallest
  while d < longest:
    out.append(d)
    d *= 2
  return out + [longest]


def run_sequence_copy(books, examples, n, targets, score_fn, d_list, context=0, batch_rows=64,
                      progress=None):
  """Scores the targets with the target sequence copied d tokens before them, for every d.

  Args:
    books, examples, n, targets, score_fn, batch_rows, progress: as run_perturbations.
    d_list: distances (check_distance for the bounds).
    context: tokens before the first target copied with it (0: the K targets only).
  Returns:
    {"baseline": float64 [B, K], "nll": {d: float64 [B, K]}, "targets": int64 [B, K]}.
  """
  examples = np.asarray(examples, np.int64).reshape(-1, 2)
  t = target_matrix(targets, len(examples), n)
  if context < 0:
    raise ProbeError("context=%d must be >= 0" % context)
  for d in d_list:
    for row_targets in t[:1] if np.all(t == t[:1]) else t:
      check_distance(d, row_targets, context)
  chunks = [slice(a, a + batch_rows) for a in range(0, len(examples), batch_rows)]
  result = {"baseline": np.zeros(t.shape, np.float64), "nll": {}, "targets": t}
  for rows in chunks:
    result["baseline"][rows] = score_rows(score_fn, example_inputs(books, examples[rows], n),
                                          t[rows], batch_rows)
  for d in d_list:
    result["nll"][d] = np.zeros(t.shape, np.float64)
    for rows in chunks:
      inputs = example_inputs(books, examples[rows], n)
      copied = np.stack([copy_targets(row, row_t, d, context)
                         for row, row_t in zip(inputs, t[rows])])
      result["nll"][d][rows] = score_rows(score_fn, copied, t[rows], batch_rows)
    if progress:
      progress("sequence copy d=%d: %d inputs" % (d, len(examples)))
  return result
