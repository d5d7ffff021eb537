"""Perturbation, sequence-copy and suffix-identification probes (pure numpy, fake models), and
every probe through the library run of the CLI."""
import math
import os

import numpy as np
import pytest

from routing_transformer.tools.probes import perturbations as pt
from routing_transformer.tools.probes import suffix as sx

N = 64
TARGETS = np.arange(N - 20, N - 16)  # K = 4, first target at 44


def unique_books(lengths, stride=100000):
  """Book b holds ids b * stride + 1, + 2, ...: every token names its book and position."""
  return [np.arange(1, n + 1, dtype=np.int64) + b * stride for b, n in enumerate(lengths)]


def random_books(rng, lengths, vocab=50):
  return [rng.integers(1, vocab, size=n).astype(np.int64) for n in lengths]


def examples_of(rng, books, count, n=N):
  book = rng.integers(0, len(books), size=count)
  end = [rng.integers(n, len(books[b]) + 1) for b in book]
  return np.stack([book, end], axis=1)


def one_line(excinfo):
  message = str(excinfo.value)
  assert "\n" not in message and message
  return message


class Recorder(object):
  """A fake score_fn: NLL = 1 + the target's token id mod 7, records every input it sees."""

  def __init__(self):
    self.calls = []

  def __call__(self, inputs, targets):
    self.calls.append((np.array(inputs), np.array(targets)))
    return 1.0 + np.take_along_axis(inputs, targets, axis=1) % 7 + 0.0


def bigram_copy_nll(inputs, targets):
  """Fake copying model: 0.1 when the bigram (x[p-1], x[p]) occurred earlier, else 5."""
  out = np.zeros(targets.shape)
  for b in range(len(inputs)):
    row = inputs[b]
    for k, p in enumerate(targets[b]):
      seen = any(row[j - 1] == row[p - 1] and row[j] == row[p] for j in range(1, p))
      out[b, k] = 0.1 if seen else 5.0
  return out


# Inputs and targets.


def test_example_inputs_cut_books_and_refuse_bad_examples():
  books = unique_books([100, 80])
  inputs = pt.example_inputs(books, [[0, 70], [1, 64]], N)
  np.testing.assert_array_equal(inputs[0], books[0][6:70])
  np.testing.assert_array_equal(inputs[1], books[1][:64])
  with pytest.raises(pt.ProbeError) as e:
    pt.example_inputs(books, [[2, 70]], N)
  assert "book 2" in one_line(e)
  with pytest.raises(pt.ProbeError) as e:
    pt.example_inputs(books, [[1, 63]], N)
  one_line(e)


def test_targets_from_the_end_and_inside_the_input():
  np.testing.assert_array_equal(pt.target_matrix([-50, -41], 2, 8192), [[8142, 8151]] * 2)
  with pytest.raises(pt.ProbeError) as e:
    pt.target_matrix([N], 1, N)
  one_line(e)


# Perturbations touch only the first m tokens.


@pytest.mark.parametrize("kind", pt.KINDS)
def test_every_kind_changes_only_the_first_m_tokens(kind, rng):
  books = random_books(rng, [300, 200, 250])
  examples = examples_of(rng, books, 12)
  inputs = pt.example_inputs(books, examples, N)
  for m in (1, 10, 44):
    changed = 0
    for b, row in enumerate(inputs):
      out, _ = pt.perturb(kind, row, TARGETS, m, pt.row_rng(0, kind, m, 0, b), books,
                          examples[b, 0])
      assert out.shape == row.shape
      np.testing.assert_array_equal(out[m:], row[m:])
      changed += int(np.any(out != row))
    if m >= 10:
      assert changed > 0, "%s changed nothing at m=%d" % (kind, m)


def test_shuffle_permutes_the_prefix(rng):
  row = rng.integers(1, 1000, size=N)
  out = pt.shuffle_prefix(row, 30, rng)
  np.testing.assert_array_equal(np.sort(out[:30]), np.sort(row[:30]))
  assert np.any(out[:30] != row[:30])


def test_replacement_is_an_m_token_span_of_another_book(rng):
  books = unique_books([300, 200, 150, 40])
  for b in range(40):
    book = b % 3
    row = books[book][100 - N:100] if book else books[0][200:200 + N]
    m = int(rng.integers(1, 45))
    out, _ = pt.perturb("replace", row, TARGETS, m, pt.row_rng(3, "replace", m, 0, b), books,
                        book)
    source = int(out[0] // 100000)
    start = int(out[0] % 100000) - 1
    assert source != book
    np.testing.assert_array_equal(out[:m], books[source][start:start + m])
    np.testing.assert_array_equal(out[m:], row[m:])


def test_replacement_without_another_long_book_is_refused():
  books = unique_books([300, 20])
  with pytest.raises(pt.ProbeError) as e:
    pt.random_span(books, 0, 30, np.random.default_rng(0))
  assert "m=30" in one_line(e)


def test_drop_marks_prefix_tokens_whose_next_occurrence_is_a_target():
  row = np.array([5, 7, 5, 8, 9, 7, 3, 5, 4, 5, 7, 2])
  np.testing.assert_array_equal(pt.next_occurrence(row),
                                [2, 5, 7, -1, -1, 10, -1, 9, -1, -1, -1, -1])
  targets = np.array([9, 10])
  assert np.flatnonzero(pt.drop_mask(row, targets, 6)).tolist() == [5]
  assert np.flatnonzero(pt.drop_mask(row, targets, 8)).tolist() == [5, 7]
  assert np.flatnonzero(pt.drop_mask(row, targets, 6, "any")).tolist() == [0, 1, 2, 5]
  out, count = pt.perturb("drop", row, targets, 8, None, pad_id=0)
  assert count == 2
  np.testing.assert_array_equal(out, [5, 7, 5, 8, 9, 0, 3, 0, 4, 5, 7, 2])


def test_drop_control_drops_as_many_random_prefix_tokens(rng):
  books = random_books(rng, [400, 300], vocab=20)  # small vocabulary: many repeats
  examples = examples_of(rng, books, 20)
  inputs = pt.example_inputs(books, examples, N)
  for b, row in enumerate(inputs):
    for m in (5, 20, 44):
      dropped, count = pt.perturb("drop", row, TARGETS, m, None, pad_id=0)
      control, count2 = pt.perturb("drop_control", row, TARGETS, m,
                                   pt.row_rng(1, "drop_control", m, 0, b), pad_id=0)
      assert count == count2 == int(np.sum(dropped != row)) == int(np.sum(control != row))
      assert np.all(control[control != row] == 0)
      assert np.all(np.flatnonzero(control != row) < m)


def test_m_reaching_the_targets_is_refused(rng):
  books = random_books(rng, [200, 200])
  with pytest.raises(pt.ProbeError) as e:
    pt.run_perturbations(books, [[0, 100]], N, TARGETS, Recorder(), [45], runs=1)
  assert "m=45" in one_line(e)


def test_runner_scores_what_it_perturbs_only_before_m(rng):
  books = random_books(rng, [300, 250, 200], vocab=30)
  examples = examples_of(rng, books, 7)
  inputs = pt.example_inputs(books, examples, N)
  fake = Recorder()
  res = pt.run_perturbations(books, examples, N, TARGETS, fake, [8, 40], runs=3, seed=5,
                             batch_rows=4)
  assert res["baseline"].shape == (7, 4)
  for kind in pt.KINDS:
    for m in (8, 40):
      assert res["nll"][kind][m].shape == ((1 if kind == "drop" else 3), 7, 4)
  baseline_calls, perturbed_calls = fake.calls[:2], fake.calls[2:]
  np.testing.assert_array_equal(np.concatenate([c[0] for c in baseline_calls]), inputs)
  order = [(kind, m, run) for kind in pt.KINDS for m in (8, 40)
           for run in range(1 if kind == "drop" else 3)]
  assert len(perturbed_calls) == 2 * len(order)
  for i, (kind, m, run) in enumerate(order):
    seen = np.concatenate([c[0] for c in perturbed_calls[2 * i:2 * i + 2]])
    for b in range(7):
      np.testing.assert_array_equal(seen[b, m:], inputs[b, m:])
      expected, _ = pt.perturb(kind, inputs[b], TARGETS, m, pt.row_rng(5, kind, m, run, b),
                               books, examples[b, 0])
      np.testing.assert_array_equal(seen[b], expected)
    for c in perturbed_calls[2 * i:2 * i + 2]:
      np.testing.assert_array_equal(c[1], np.broadcast_to(TARGETS, c[1].shape))
  np.testing.assert_array_equal(res["nll"]["shuffle"][8][0], res["baseline"])  # targets intact
  drops = [int(np.sum(pt.drop_mask(inputs[b], TARGETS, 40))) for b in range(7)]
  assert res["dropped"][40].tolist() == drops


def test_runner_is_deterministic_in_the_seed_and_independent_of_batching(rng):
  books = random_books(rng, [300, 250, 200], vocab=30)
  examples = examples_of(rng, books, 6)

  def inputs_seen(seed, batch_rows, kinds=pt.KINDS):
    fake = Recorder()
    pt.run_perturbations(books, examples, N, TARGETS, fake, [20], runs=2, seed=seed,
                         kinds=kinds, batch_rows=batch_rows)
    return np.concatenate([c[0] for c in fake.calls])

  first = inputs_seen(1, 6)
  np.testing.assert_array_equal(first, inputs_seen(1, 1))
  assert np.any(first != inputs_seen(2, 6))
  only_replace = inputs_seen(1, 6, kinds=("replace",))
  np.testing.assert_array_equal(only_replace[6:], first[6 + 12:6 + 24])  # after 2 shuffle runs


def test_score_fn_of_the_wrong_shape_is_refused(rng):
  books = random_books(rng, [200, 200])
  with pytest.raises(pt.ProbeError) as e:
    pt.run_perturbations(books, [[0, 100]], N, TARGETS, lambda x, t: np.zeros(len(x)), [8])
  one_line(e)


# Sequence copy.


@pytest.mark.parametrize("context", [0, 3])
def test_copy_sits_exactly_d_tokens_before_the_targets(context):
  row = np.arange(1, N + 1)
  for d in (4, 5, 20, 44 - context):
    out = pt.copy_targets(row, TARGETS, d, context)
    assert out.shape == row.shape
    np.testing.assert_array_equal(out[TARGETS - d], row[TARGETS])
    np.testing.assert_array_equal(out[TARGETS[0] - d - context:TARGETS[0] - d],
                                  row[TARGETS[0] - context:TARGETS[0]])
    keep = TARGETS[-1] + 1 - d  # untouched from here on: the gap, the targets, the rest
    np.testing.assert_array_equal(out[keep:], row[keep:])
    start = TARGETS[0] - context - d
    np.testing.assert_array_equal(out[:start], row[4 + context:start + 4 + context])


def test_copy_distance_outside_the_prefix_is_refused():
  row = np.arange(1, N + 1)
  with pytest.raises(pt.ProbeError) as e:
    pt.copy_targets(row, TARGETS, 45)
  assert "d=45" in one_line(e) and "d <= 44" in str(e.value)
  with pytest.raises(pt.ProbeError) as e:
    pt.copy_targets(row, TARGETS, 3)  # would overlap the 4 targets
  one_line(e)
  with pytest.raises(pt.ProbeError):
    pt.run_sequence_copy([np.arange(1, 200)], [[0, 100]], N, TARGETS, Recorder(), [64])


def test_sequence_copy_helps_a_copying_model_only_where_it_can_copy():
  books = unique_books([200, 150])  # no token repeats: nothing to copy without the probe
  examples = np.array([[0, 100], [1, 150], [0, 64]])
  res = pt.run_sequence_copy(books, examples, N, TARGETS, bigram_copy_nll, [4, 16, 44])
  np.testing.assert_array_equal(res["baseline"], 5.0)
  for d in (4, 16, 44):  # the first target's bigram starts before the copy: not copyable
    np.testing.assert_array_equal(res["nll"][d][:, 0], 5.0)
    np.testing.assert_array_equal(res["nll"][d][:, 1:], 0.1)
  res = pt.run_sequence_copy(books, examples, N, TARGETS, bigram_copy_nll, [16], context=1)
  np.testing.assert_array_equal(res["nll"][16], 0.1)


def test_copy_distances_reach_the_longest_possible():
  assert pt.copy_distances(8142) == [64, 128, 256, 512, 1024, 2048, 4096, 8142]
  assert pt.copy_distances(100, context=4, smallest=64) == [64, 96]


# Suffix identification.


class FakeEncoder(object):
  PIECES = ["<pad>", "<EOS>", "Hello", ". ", ".\" ", "!", "?\u201d\n", ", ", "Mr", "...", "'",
            "end._"]

  vocab_size = len(PIECES)

  def decode(self, ids):
    return self.PIECES[ids[0]]


class RawEncoder(object):
  _subtoken_id_to_subtoken_string = ["<pad>", "<EOS>", "word_", "._", "?\"_", "a"]
  vocab_size = 6

  def decode(self, ids):
    raise ValueError("no decoding")


def test_sentence_end_table_from_subword_pieces():
  assert sx.sentence_end_table(FakeEncoder()).tolist() == [
      False, False, False, True, True, True, True, False, False, True, False, True]
  assert sx.sentence_end_table(RawEncoder()).tolist() == [False, False, False, True, True, False]
  with pytest.raises(pt.ProbeError) as e:
    sx.sentence_ends(np.array([3, 12]), sx.sentence_end_table(FakeEncoder()))
  one_line(e)


def suffix_books(rng, lengths=(3000, 2500, 2000)):
  books = unique_books(lengths)
  ends = [rng.random(len(b)) < 0.05 for b in books]
  return books, ends


def test_suffix_candidates_are_disjoint_sentence_starts_outside_prefix_and_gold(rng):
  books, ends = suffix_books(rng)
  max_prefix, length = 500, 64
  ex = sx.sample_suffix_examples(books, ends, 40, max_prefix, length, negatives=5, seed=3)
  assert ex.shape == (40, 7)
  assert len({(b, g) for b, g in ex[:, :2]}) == 40
  for book, gold, *negs in ex:
    assert gold >= max_prefix and ends[book][gold - 1]
    spans = [(gold - max_prefix, gold + length)] + [(q, q + length) for q in negs]
    for q in negs:
      assert ends[book][q - 1] and q + length <= len(books[book])
    for i, (a, b) in enumerate(spans):
      for c, d in spans[i + 1:]:
        assert b <= c or d <= a, (spans, book)
  np.testing.assert_array_equal(
      ex, sx.sample_suffix_examples(books, ends, 40, max_prefix, length, negatives=5, seed=3))
  assert np.any(ex != sx.sample_suffix_examples(books, ends, 40, max_prefix, length, seed=4))


def test_suffix_candidate_rows_share_the_prefix(rng):
  books, ends = suffix_books(rng)
  ex = sx.sample_suffix_examples(books, ends, 3, 300, 32, seed=0)
  rows = sx.candidate_inputs(books, ex[0], 100, 32)
  book, gold = ex[0][:2]
  assert rows.shape == (6, 132)
  np.testing.assert_array_equal(rows[:, :100], np.broadcast_to(books[book][gold - 100:gold],
                                                              (6, 100)))
  for row, start in zip(rows, ex[0][1:]):
    np.testing.assert_array_equal(row[100:], books[book][start:start + 32])
  with pytest.raises(pt.ProbeError) as e:
    sx.candidate_inputs(books, [book, 50, 0, 0, 0, 0, 0], 100, 32)
  one_line(e)


def continuity_nll(inputs, targets):
  """Prefers the true continuation: NLL 0 where a token follows its predecessor in the book."""
  x = np.take_along_axis(inputs, targets, axis=1)
  prev = np.take_along_axis(inputs, targets - 1, axis=1)
  return np.where(x == prev + 1, 0.0, 1.0)


def test_suffix_accuracy_one_for_a_gold_preferring_model_chance_for_a_constant(rng):
  books, ends = suffix_books(rng)
  ex = sx.sample_suffix_examples(books, ends, 20, 400, 32, seed=1)
  res = sx.run_suffix_identification(books, ex, [50, 400], continuity_nll, suffix_length=32,
                                     batch_examples=3)
  assert res["accuracy"] == {50: 1.0, 400: 1.0}
  assert res["mean_nll"][50].shape == (20, 6)
  const = sx.run_suffix_identification(books, ex, [50], lambda x, t: np.ones(t.shape),
                                       suffix_length=32)
  assert const["accuracy"][50] == pytest.approx(1 / 6)
  worst = sx.run_suffix_identification(books, ex, [50], lambda x, t: 1 - continuity_nll(x, t),
                                       suffix_length=32)
  assert worst["accuracy"][50] == 0.0
  with pytest.raises(pt.ProbeError) as e:
    sx.run_suffix_identification(books, ex, [2030], continuity_nll, suffix_length=32,
                                 max_length=2048)
  assert "2016" in one_line(e)


def test_tie_credit_is_shared_among_the_tied_candidates():
  credit = sx.identification_credit([[1, 2, 3], [1, 1, 3], [2, 1, 1], [1, 1, 1]])
  np.testing.assert_allclose(credit, [1, 0.5, 0, 1 / 3])


def test_too_few_negatives_is_refused(rng):
  books, ends = suffix_books(rng, lengths=(700,))
  with pytest.raises(pt.ProbeError) as e:
    sx.sample_suffix_examples(books, ends, 2, 500, 64, seed=0)
  one_line(e)


# Every probe through the library run the CLI calls (probe.probe), on a fake model.


class SentenceEncoder(object):
  """A fake vocabulary of 40 ids: ids divisible by 7 are pieces ending a sentence."""
  vocab_size = 40

  def decode(self, ids):
    return "w%d. " % ids[0] if ids[0] % 7 == 0 else "w%d" % ids[0]


def fake_books(rng):
  from routing_transformer.tools.probes import data
  return [data.Book(i + 1, "Book %d" % (i + 1), rng.integers(2, 40, n).astype(np.int32), n // 2,
                    n * 3) for i, n in enumerate((700, 500, 450))]


class FakeModels(object):
  """make_score_fn: a copying model (NLL 0.5 when the target's id occurs earlier in the input,
  else 3; x 1.2 for a derived local model); counts builds and records the target ids seen."""

  def __init__(self):
    self.built, self.seen = [], []

  def __call__(self, spec):
    self.built.append(spec.label)
    scale = 1.2 if spec.as_local else 1.0

    def score_fn(inputs, targets):
      inputs, targets = np.asarray(inputs), np.asarray(targets)
      tokens = np.take_along_axis(inputs, targets, 1)
      self.seen.append((spec.label, inputs.shape[1], targets.shape[1], tokens))
      seen = np.array([[tok in row[:p] for tok, p in zip(trow, prow)]
                       for row, trow, prow in zip(inputs, tokens, targets)])
      return scale * np.where(seen, 0.5, 3.0)

    score_fn.length, score_fn.batch_size = 128, 4
    return score_fn


ALL_PROBES = ["--probes=token,perturb,copy,suffix", "--perturb_m=32,96", "--perturb_runs=2",
              "--suffix_prefixes=32,100", "--suffix_length=16", "--suffix_examples=10"]


def run_all(out_dir, models, books, argv=()):
  from routing_transformer.tools.probes import __main__ as cli
  from routing_transformer.tools.probes import probe
  from routing_transformer.tools.probes import run as run_lib
  args = cli.parse_args(["--output=" + out_dir] + ALL_PROBES + list(argv))
  specs = [run_lib.ModelSpec("rt", "ckpt", "set"), run_lib.ModelSpec("rt-as-local", "ckpt", "set",
                                                                      "", True)]
  return probe.probe(specs, books, SentenceEncoder(), [64, 128], 128, out_dir, span=(-30, -20),
                     num_targets=120, seed=3, profile=50, bootstrap=50, batch_size=4,
                     make_score_fn=models, stream=None, probes=args.probes,
                     options=cli.options_of(args))


def test_every_probe_runs_with_counts_intervals_and_shared_targets(rng, tmp_path):
  import json
  from routing_transformer.tools.probes import report
  from routing_transformer.tools.probes import sampling
  books = fake_books(rng)
  models = FakeModels()
  out = str(tmp_path / "out")
  result = run_all(out, models, books)
  assert models.built == ["rt", "rt-as-local"]  # each model restored once for all probes
  paths = report.write(result, out)
  for name in ("perturbations", "copy", "suffix", "categories"):
    assert os.path.getsize(os.path.join(out, "probes_%s.png" % name)) > 0
  with open(os.path.join(out, "probes.json")) as f:
    result = json.load(f)
  p = result["protocol"]
  assert p["probes"] == ["token", "perturb", "copy", "suffix"]
  assert p["perturb"]["m"] == [32, 96] and p["perturb"]["n"] == 128
  assert p["copy"]["d"] == pt.copy_distances(98)  # default: up to the first target (128 - 30)
  assert p["suffix"]["prefixes"] == [32, 100] and p["suffix"]["chance"] == pytest.approx(1 / 6)

  def checked(fig, tokens):
    assert fig["tokens"] == tokens and fig["ppl"] == pytest.approx(
        math.exp(1.248 * fig["nll"]))
    assert fig["ci"][0] <= fig["ppl"] <= fig["ci"][1]

  for label, m in result["models"].items():
    token_all = m["figures"]["128"]["categories"]["all"]
    checked(token_all, 120)
    for fig in [m["perturb"]["baseline"], m["copy"]["baseline"]]:
      checked(fig, 120)
      assert fig["nll"] == pytest.approx(token_all["nll"])  # the token probe's own targets
    for kind in pt.KINDS:
      for mm in ("32", "96"):
        checked(m["perturb"]["kinds"][kind][mm], 120)
        assert m["perturb"]["kinds"][kind][mm]["runs"] == (1 if kind == "drop" else 2)
    assert m["perturb"]["dropped"]["96"]["inputs"] == 12
    for d in p["copy"]["d"]:
      checked(m["copy"]["distances"][str(d)], 120)
    for x in ("32", "100"):
      s = m["suffix"]["prefixes"][x]
      assert s["examples"] == 10 and s["tokens"] == 10 * 6 * 16
      assert s["ci"][0] <= s["accuracy"] <= s["ci"][1]
  # a copying model profits from the copy, loses from dropping the targets' earlier occurrences
  rt = result["models"]["rt"]
  assert rt["copy"]["distances"]["64"]["nll"] == pytest.approx(0.5)
  assert rt["perturb"]["kinds"]["drop"]["96"]["nll"] > rt["perturb"]["kinds"]["drop_control"][
      "96"]["nll"]
  assert result["models"]["rt-as-local"]["perturb"]["baseline"]["nll"] == pytest.approx(
      1.2 * rt["perturb"]["baseline"]["nll"])
  # targets: every perturbed/copied input of every model kept the sampled targets' ids
  ex = sampling.sample_examples([len(b.ids) for b in books], 12, (-30, -20), 128, 3)
  want = np.take_along_axis(sampling.inputs([b.ids for b in books], ex, 128),
                            sampling.positions(ex, 128), 1)
  rows = {tuple(r) for r in want}
  k10 = [t for label, n, k, t in models.seen if n == 128 and k == 10]
  assert len(k10) > 20 and all(tuple(r) in rows for t in k10 for r in t)
  md = open(paths[1]).read()
  assert "**Perturbations**" in md and "**Sequence copy**" in md and "chance 0.167" in md


def test_a_rerun_skips_finished_shards(rng, tmp_path):
  books = fake_books(rng)
  out = str(tmp_path / "out")
  first = run_all(out, FakeModels(), books)
  again = FakeModels()
  second = run_all(out, again, books)
  assert again.built == [] and again.seen == []  # nothing restored, nothing scored
  for label in first["models"]:
    for name in ("perturb", "copy", "suffix"):
      a, b = dict(first["models"][label][name]), dict(second["models"][label][name])
      assert a.pop("seconds") == b.pop("seconds") and a == b
  os.remove(os.path.join(out, "shards", "rt-as-local", "copy.npz"))
  third = FakeModels()
  run_all(out, third, books)
  assert third.built == ["rt-as-local"] and {n for _, n, _, _ in third.seen} == {128}
  changed = FakeModels()  # another protocol (m list): only the perturbation shards are redone
  run_all(out, changed, books, ["--perturb_m=32"])
  assert changed.built == ["rt", "rt-as-local"]
  assert len(changed.seen) == 2 * (3 * (1 + 2 + 2 + 1 + 2))  # 2 models x 3 chunks x passes


def test_library_refuses_bad_probe_settings_before_scoring(rng, tmp_path):
  from routing_transformer.tools.probes.errors import ProbeError
  books = fake_books(rng)
  models = FakeModels()
  for argv, message in ((["--perturb_m=99"], "--perturb_m: m=99 must be in 1..98"),
                        (["--probes=token,shuffle"], "--probes=token,shuffle: give some of"),
                        (["--copy_distances=5"], "--copy_distances: copy distance d=5"),
                        (["--suffix_prefixes=120"], "--suffix_prefixes: prefix 120 + suffix 16"),
                        (["--perturb_kinds=shuffle,swap"], "--perturb_kinds=shuffle,swap")):
    with pytest.raises(ProbeError) as e:
      run_all(str(tmp_path / "o"), models, books, argv)
    assert message in one_line(e)
  assert models.built == []
  from routing_transformer.tools.probes import runners
  with pytest.raises(ProbeError) as e:
    runners.default_perturb_m(98)
  assert "--perturb_m" in one_line(e)
  assert runners.default_perturb_m(8142) == list(range(512, 7681, 512))
  assert runners.default_suffix_prefixes(8192, 128) == [200, 512, 1024, 2048, 4096, 8064]
  assert runners.default_suffix_prefixes(2048, 128) == [200, 512, 1024, 1920]
  assert pt.ProbeError is ProbeError


def test_one_probe_alone_without_the_token_probe(rng, tmp_path):
  from routing_transformer.tools.probes import report
  out = str(tmp_path / "out")
  result = run_all(out, FakeModels(), fake_books(rng), ["--probes=suffix"])
  assert result["protocol"]["probes"] == ["suffix"]
  assert result["models"]["rt"]["figures"] == {} and "perturb" not in result["models"]["rt"]
  paths = report.write(result, out)
  assert [os.path.basename(p) for p in paths] == ["probes.json", "probes.md", "probes_suffix.png"]
  assert open(paths[1]).read().lstrip().startswith("**Suffix identification**")
