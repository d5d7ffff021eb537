"""The long-range context probes: sampling, categories, scaling by hand; score_fn against the
Scorer; the derived local model against a local-only model; the CLI end to end and its errors."""
import csv
import json
import math
import os

import numpy as np
import pytest

from routing_transformer.tools.probes import categories as cats
from routing_transformer.tools.probes import probe
from routing_transformer.tools.probes import report
from routing_transformer.tools.probes import run as run_lib
from routing_transformer.tools.probes import sampling
from routing_transformer.tools.probes.errors import ProbeError

SET, LOCAL_SET = "routing_transformer_test", "local_transformer_test"  # L = 64
WORDS = ("the cat sat on a mat while dogs ran far away from home and sang extraordinarily "
         "incomprehensible antidisestablishmentarianism").split()


# Sampling.


def test_sampling_is_deterministic_proportional_and_inside_the_books():
  lengths = [5000, 1000, 2500, 300, 40]
  a = sampling.sample_examples(lengths, 1000, (-50, -40), 512, seed=7)
  b = sampling.sample_examples(lengths, 1000, (-50, -40), 512, seed=7)
  c = sampling.sample_examples(lengths, 1000, (-50, -40), 512, seed=8)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a.end, c.end)
  counts = np.bincount(a.book, minlength=len(lengths))
  # books shorter than the longest input get none; the others in proportion to their length
  assert counts[3] == counts[4] == 0
  share = 1000 * np.array(lengths[:3]) / sum(lengths[:3])
  assert np.all(np.abs(counts[:3] - share) < 1)
  assert a.targets.shape == (1000, 10)
  np.testing.assert_array_equal(a.targets - a.end[:, None], np.tile(np.arange(-50, -40), (1000, 1)))
  assert np.all(a.end >= 512) and np.all(a.end <= np.array(lengths)[a.book])
  assert len(set(zip(a.book, a.end))) == 1000  # no input drawn twice
  assert sampling.allocate([3, 1], 5).tolist() == [4, 1]


def test_inputs_keep_their_targets_and_end_for_every_length():
  rng = np.random.default_rng(0)
  books = [rng.integers(2, 50, 3000), rng.integers(2, 50, 1200)]
  ex = sampling.sample_examples([len(b) for b in books], 40, (-50, -40), 1024, seed=1)
  targets = {}
  for n in (128, 512, 1024):
    ids = sampling.inputs(books, ex, n)
    pos = sampling.positions(ex, n)
    assert ids.shape == (40, n) and pos.min() >= 0 and pos.max() < n  # never past the input
    np.testing.assert_array_equal(pos, n + np.arange(-50, -40)[None].repeat(40, 0))
    targets[n] = np.take_along_axis(ids, pos, 1)
    longer = sampling.inputs(books, ex, 1024)
    np.testing.assert_array_equal(ids, longer[:, 1024 - n:])  # cut from the left
  np.testing.assert_array_equal(targets[128], targets[1024])


def test_bad_spans_and_lengths_name_the_fix():
  assert sampling.parse_span("-50:-40") == (-50, -40)
  for bad in ("50:40", "-40:-50", "x"):
    with pytest.raises(ProbeError, match="START"):
      sampling.parse_span(bad)
  with pytest.raises(ProbeError, match="span -600:-590 reaches 600 tokens back"):
    sampling.sample_examples([10000], 5, (-600, -590), 512, 0)
  with pytest.raises(ProbeError, match="above the model's length L=1024"):
    probe.check_lengths([512, 2048], 1024, (-50, -40), 64)
  with pytest.raises(ProbeError, match="use N >= 64"):
    probe.check_lengths([32, 512], 1024, (-50, -40), 64)
  with pytest.raises(ProbeError, match="no book has the 512 tokens"):
    sampling.sample_examples([100, 200], 5, (-50, -40), 512, 0)


# Categories, on hand-made sequences.


def test_distances_and_never_seen_from_the_full_length_input():
  ids = np.array([5, 6, 5, 7, 8, 6, 9, 5, 7, 10])
  np.testing.assert_array_equal(cats.previous_occurrence(ids),
                                [-1, -1, 0, -1, -1, 1, -1, 2, 3, -1])
  # targets at book positions 7 (id 5, last seen at 2: distance 5), 8 (id 7, at 3: distance 5),
  # 9 (never); the full input is the 10 tokens ending at 10: far, far, never for every N (at
  # N = 6 the last occurrences lie outside the prefix; the categories do not change)
  ex = sampling.Examples(np.array([0]), np.array([10]), np.array([[7, 8, 9]]))
  book = [type("B", (), {"ids": ids})()]
  codes = probe.target_categories(book, ex, 10, np.zeros(20, bool), None, threshold=4)
  assert [cats.DISTANCE[c] for c in codes["distance"][0]] == ["far", "far", "never"]
  assert codes["frequency"].tolist() == [[1, 1, 1]] and codes["word"] is None
  # a full input of 6 tokens (positions 4..9) does not hold the last occurrences: never
  codes = probe.target_categories(book, ex, 6, np.zeros(20, bool), None, threshold=4)
  assert [cats.DISTANCE[c] for c in codes["distance"][0]] == ["never", "never", "never"]
  assert cats.distance_category([3, 3, 5, -1], [10, 2, 10, 10], 4).tolist() == [0, 2, 1, 2]


class CopyingModel(object):
  """make_score_fn of a copying model: NLL 0.5 when the target's id occurs earlier in its input,
  else 3.0."""

  def __call__(self, spec):
    def score_fn(inputs, targets):
      inputs, targets = np.asarray(inputs), np.asarray(targets)
      tokens = np.take_along_axis(inputs, targets, 1)
      seen = np.array([[tok in row[:p] for tok, p in zip(trow, prow)]
                       for row, trow, prow in zip(inputs, tokens, targets)])
      return np.where(seen, 0.5, 3.0)

    score_fn.length, score_fn.batch_size = 128, 8
    return score_fn


def test_categories_hold_the_same_targets_at_every_prefix_length(tmp_path):
  """Sun et al.'s categories are fixed from the full-length (128-token) input: every category
  has the same tokens at N = 16 ... 128, "far" (last seen > 24 back) is not empty at N <= 24, and
  a copying model copies the far targets only once N reaches their last occurrence."""
  from routing_transformer.tools.probes import data
  rng = np.random.default_rng(4)
  books = [data.Book(i + 1, "Book %d" % (i + 1), rng.integers(2, 60, n).astype(np.int32),
                     n // 2, n * 3) for i, n in enumerate((900, 700, 600))]
  encoder = type("E", (), {"vocab_size": 60})()
  result = probe.probe([run_lib.ModelSpec("copy", "ckpt", "set")], books, encoder,
                       [16, 24, 64, 128], 128, str(tmp_path), span=(-12, -2), num_targets=400,
                       far_threshold=24, profile=12, bootstrap=0, make_score_fn=CopyingModel(),
                       stream=None)
  assert result["protocol"]["categories_from_length"] == 128
  figs = result["models"]["copy"]["figures"]
  for name in ("all", "near", "far", "never", "frequent", "infrequent"):
    counts = [figs[n]["categories"][name]["tokens"] for n in ("16", "24", "64", "128")]
    assert len(set(counts)) == 1, (name, counts)
  assert figs["16"]["categories"]["far"]["tokens"] > 20
  assert figs["16"]["categories"]["far"]["nll"] == pytest.approx(3.0)  # outside the input
  assert figs["128"]["categories"]["far"]["nll"] == pytest.approx(0.5)  # copied
  assert figs["16"]["categories"]["never"]["nll"] == figs["128"]["categories"]["never"]["nll"] \
      == pytest.approx(3.0)
  assert figs["128"]["categories"]["near"]["nll"] == pytest.approx(0.5)


def test_frequent_types_and_word_pieces():
  corpus = [np.array([3, 3, 3, 4, 4, 5, 9]), np.array([4, 3])]
  frequent = cats.frequent_types(corpus, 20, fraction=0.1)  # top 2 of 20 types
  assert np.flatnonzero(frequent).tolist() == [3, 4]
  assert np.flatnonzero(cats.frequent_types(corpus, 100, 0.1)).tolist() == [3, 4, 5, 9]
  # pieces: 2 "ex" 3 "tra_" 4 "a_" 5 "b"
  ends = np.array([False, False, False, True, True, False])
  ids = np.array([2, 3, 4, 5, 2, 3])
  word = cats.word_position(ids, np.arange(6), ends)
  assert [cats.WORD[c] for c in word] == ["word_first", "word_rest", "word_whole", "word_first",
                                          "word_rest", "word_rest"]


def test_word_ends_follow_t2t_escaping():
  from tensor2tensor.data_generators import text_encoder
  encoder = text_encoder.SubwordTextEncoder()
  encoder.build_from_token_counts({"the": 50, "cat": 40, "incomprehensible": 1}, min_count=2)
  ends = cats.word_ends(encoder)
  ids = np.array(encoder.encode("the incomprehensible cat"))
  word = [cats.WORD[c] for c in cats.word_position(ids, np.arange(len(ids)), ends)]
  assert word[0] == "word_whole" and word[-1] == "word_whole"
  assert word[1] == "word_first" and set(word[2:-1]) == {"word_rest"} and len(ids) > 3
  assert encoder.decode(ids.tolist()) == "the incomprehensible cat"


# The books: Sun et al.'s exclusion.


def write_layout(root, split, books):
  """A PG-19 layout: books {id: (title, text)} in root/split, their titles in metadata.csv."""
  os.makedirs(os.path.join(root, split), exist_ok=True)
  with open(os.path.join(root, "metadata.csv"), "w", newline="") as f:
    csv.writer(f).writerows([[i, title, "1900", "http://www.gutenberg.org/ebooks/%d" % i]
                             for i, (title, _) in sorted(books.items())])
  for i, (_, text) in books.items():
    with open(os.path.join(root, split, "%d.txt" % i), "w") as f:
      f.write(text)
  return root


def test_canterbury_tales_are_left_out_by_id_or_normalized_title(tmp_path):
  """The default exclusion matches the book's id (2383) or its title however metadata.csv spells
  it (case, punctuation, spacing); a validation folder without it is refused with the fix."""
  from tensor2tensor.data_generators import text_encoder
  from routing_transformer.tools.probes import data
  encoder = text_encoder.SubwordTextEncoder()
  encoder.build_from_token_counts({w: 5 for w in WORDS}, min_count=1)
  text = "the cat sat on a mat\nwhile dogs ran\n"
  assert data.normalize_title("The  Canterbury Tales, and Other Poems.") == \
      "the canterbury tales and other poems"
  assert data.matches(7, "Moby-Dick; or, The Whale", "moby dick or the whale")
  assert data.matches(7, "x", "7") and not data.matches(7, "x", "70")
  for books, left_out in [
      ({12: ("THE CANTERBURY TALES, AND OTHER POEMS", text), 13: ("Emma", text)}, 12),
      ({2383: ("Chaucer: Canterbury Tales (annotated)", text), 13: ("Emma", text)}, 2383)]:
    root = write_layout(str(tmp_path / str(left_out)), "validation", books)
    kept, excluded = data.load_books(root, "validation", encoder)
    assert [b.book_id for b in kept] == [13] and [e[0] for e in excluded] == [left_out]
    assert kept[0].ids.tolist() == encoder.encode("the cat sat on a mat") + encoder.encode(
        "while dogs ran")  # read as stripped lines
  root = write_layout(str(tmp_path / "none"), "validation", {13: ("Emma", text)})
  with pytest.raises(ProbeError, match="has no 'The Canterbury Tales and Other Poems' "
                     r"\(id 2383.*--no_default_exclude") as e:
    data.load_books(root, "validation", encoder)
  assert "\n" not in str(e.value)
  kept, excluded = data.load_books(root, "validation", encoder, default_exclude=False)
  assert [b.book_id for b in kept] == [13] and not excluded
  whole, _ = data.load_books(root, "validation", encoder, default_exclude=False,
                             reading="whole_text")
  assert whole[0].ids.tolist() == encoder.encode(text.strip())  # the newline, escaped
  assert len(whole[0].ids) > len(kept[0].ids)


# Scaling and intervals.


def test_perplexity_scale_and_bootstrap_by_hand():
  sums, counts = np.array([2.0, 4.0, 0.0]), np.array([2, 2, 0])
  fig = report.figure(sums, counts, 1.248, report.resample_weights(3, 200, 0))
  assert fig["tokens"] == 4 and fig["nll"] == pytest.approx(1.5)
  assert fig["ppl"] == pytest.approx(math.exp(1.248 * 1.5))
  assert math.exp(1.248 * 1.0) - 1e-9 <= fig["ci"][0] <= fig["ppl"] <= fig["ci"][1] <= \
      math.exp(1.248 * 2.0) + 1e-9
  books = [type("B", (), {"ids": np.zeros(130), "words": 100})()]
  assert probe.word_scale(books, "exact") == pytest.approx(1.3)
  assert probe.word_scale(books, "1.248") == 1.248
  with pytest.raises(ProbeError, match="exact"):
    probe.word_scale(books, "words")
  # the paper's measured rate: ~104 h on one RTX8000 for ~3M tokens at 8K, 10 targets each
  assert probe.paper_rate(8192) == pytest.approx(104 * 3600 / 300000) == pytest.approx(1.248)
  assert probe.paper_rate(2048) == pytest.approx(1.248 / 4)
  hp = type("H", (), dict(hidden_size=4, filter_size=8, num_decoder_layers=1,
                          num_hidden_layers=1, local_num_heads=2, sparsity_cluster_num_heads=0,
                          sparsity_skip_first=0, query_shape=(16,), memory_flange=(16,),
                          sparsity_cluster_attention_window=8, ffn_layer="dense_relu_dense",
                          embedding_dims=4, max_target_length=64, max_length=64))()
  # 2 x (4 h^2 + 2 h f) + 2 x 2 x depth 2 x 2 heads x 32 keys + logits 2 h V + emb 2 h h
  assert probe.scoring.forward_flops_per_token(hp, 10, 64) == 2 * (64 + 64) + 2 * 2 * 2 * 64 + \
      80 + 32
  assert probe.scoring.local_receptive_field(hp) == 31


# With a model.


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """(vocab file, routing checkpoint dir, PG-19 layout dir) of a random routing_transformer_test
  model and three books."""
  from tensor2tensor.data_generators import text_encoder
  from test_scoring import write_model  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("probes")
  encoder = text_encoder.SubwordTextEncoder()
  encoder.build_from_token_counts({w: 20 - i for i, w in enumerate(WORDS)}, min_count=8)
  vocab = str(root / "vocab.subwords")
  encoder.store_to_file(vocab)
  write_model(str(root / "rt"), encoder.vocab_size, seed=4)
  rng = np.random.default_rng(2)
  os.makedirs(root / "books" / "test")
  os.makedirs(root / "books" / "validation")
  rows = []
  for book_id, words in ((1, 300), (2, 150), (3, 220)):
    with open(root / "books" / "test" / ("%d.txt" % book_id), "w") as f:
      f.write(" ".join(rng.choice(WORDS, words)))
    rows.append([book_id, "Book %d" % book_id, "", ""])
  with open(root / "books" / "metadata.csv", "w", newline="") as f:
    csv.writer(f).writerows(rows)
  return vocab, str(root / "rt"), str(root / "books")


def scorer_of(tiny, hparams_set, as_local=False):
  from routing_transformer.tools.probes import scoring
  return scoring.build_scorer(tiny[1], hparams_set, tiny[0], as_local=as_local, batch_size=3)


@pytest.fixture(scope="module")
def routing_scorer(tiny):
  scorer = scorer_of(tiny, SET)
  yield scorer
  scorer.close()


def test_score_fn_at_full_length_equals_the_scorer_and_one_pass_per_input(routing_scorer):
  from routing_transformer.tools.probes import scoring
  scorer = routing_scorer
  score_fn = scoring.make_score_fn(scorer)
  rng = np.random.default_rng(1)
  books = [rng.integers(2, scorer.vocab_size, 300), rng.integers(2, scorer.vocab_size, 200)]
  ex = sampling.sample_examples([300, 200], 7, (-30, -20), 64, seed=3)
  offsets = list(range(-40, 0))
  calls = []

  def counted(ids, pos):
    calls.append(len(ids))
    return score_fn(ids, pos)

  nll = run_lib.score_length(counted, books, ex, 64, offsets, 3)
  assert calls == [3, 3, 1]  # 7 inputs, every target of an input in its one pass
  want = scorer.score_ids([(books[b][e - 64:e].tolist(), 0) for b, e in zip(ex.book, ex.end)])
  np.testing.assert_allclose(nll, -np.stack(want)[:, 24:], rtol=1e-5, atol=1e-6)
  # shorter N: the same as the Scorer's padded window of those tokens
  short = run_lib.score_length(score_fn, books, ex, 48, offsets, 3)
  want = scorer.score_ids([(books[b][e - 48:e].tolist(), 0) for b, e in zip(ex.book, ex.end)])
  np.testing.assert_allclose(short, -np.stack(want)[:, 8:], rtol=1e-5, atol=1e-6)
  with pytest.raises(ProbeError, match="above the model's length L=64"):
    score_fn(np.ones([1, 65], np.int32), np.zeros([1, 1], np.int32))
  with pytest.raises(ProbeError, match="positions must be in 0..31"):
    score_fn(np.ones([1, 32], np.int32), np.full([1, 1], 40))


def test_derived_local_model_equals_a_local_only_model_with_the_same_weights(tiny,
                                                                           routing_scorer):
  ids = np.random.default_rng(0).integers(2, 30, [4, 64]).astype(np.int32)
  pos = np.tile(np.arange(64), (4, 1))
  values = {"routing": routing_scorer.log_probs_at(ids, pos)}
  for name, hparams_set, as_local in (("derived", SET, True), ("local", LOCAL_SET, False)):
    scorer = scorer_of(tiny, hparams_set, as_local)
    values[name] = scorer.log_probs_at(ids, pos)
    scorer.close()
  np.testing.assert_array_equal(values["derived"], values["local"])
  assert np.abs(values["derived"] - values["routing"]).max() > 1e-3  # the routing heads matter


def test_cli_end_to_end_resumes_and_merges(tiny, tmp_path, capsys):
  from routing_transformer.tools.probes import __main__ as cli
  vocab, ckpt, books = tiny
  out = str(tmp_path / "out")
  argv = ["--books_dir=" + books, "--split=test", "--checkpoint=rt=" + ckpt, "--hparams_set=" + SET,
          "--as_local=rt", "--vocab=" + vocab, "--lengths=50,64", "--span=-30:-20",
          "--profile=50", "--targets=120", "--far_threshold=16", "--bootstrap=50",
          "--batch_size=4", "--output=" + out, "--exclude=2"]
  assert cli.main(argv) == 0
  err = capsys.readouterr().err
  assert "inputs" in err and "tokens/s" in err and "excluded: 2 Book 2" in err
  with open(os.path.join(out, "probes.json")) as f:
    result = json.load(f)
  p = result["protocol"]
  assert p["inputs"] == 12 and p["targets"] == 120 and [b[0] for b in p["books"]] == [1, 3]
  assert set(result["models"]) == {"rt", "rt-as-local"}
  figs = result["models"]["rt"]["figures"]["64"]
  c = figs["categories"]
  assert c["all"]["tokens"] == 120
  assert c["frequent"]["tokens"] + c["infrequent"]["tokens"] == 120
  assert c["near"]["tokens"] + c["far"]["tokens"] + c["never"]["tokens"] == 120
  assert sum(c[w]["tokens"] for w in cats.WORD) == 120
  short = result["models"]["rt"]["figures"]["50"]["categories"]
  assert {k: v["tokens"] for k, v in short.items()} == {k: v["tokens"] for k, v in c.items()}
  assert set(figs["end_spans"]) == {"-11:-1", "-15:-5", "-20:-10", "-50:-40"}
  assert len(figs["position_nll"]) == 50
  assert result["models"]["rt"]["figures"]["50"]["categories"]["all"]["nll"] != c["all"]["nll"]
  est = result["estimate"]["released_model_full_protocol"]["vocab_32768"]
  assert est["passes"] == 22000 * 9 and est["tokens"] == 22000 * 9 * 8192
  assert est["accelerator_hours"] == pytest.approx(
      est["flops_per_token"] * est["tokens"] / 1e14 / 3600)
  assert est["paper_rate_hours"] == pytest.approx(22000 * 9 * 1.248 / 3600)  # 68.6 h, RTX8000
  assert est["paper_rate_flops_per_s"] == pytest.approx(est["flops_per_token"] * 8192 / 1.248)
  assert 15 < 1e14 / est["paper_rate_flops_per_s"] < 20  # the FLOP model's 1e14 is ~18x that
  assert p["reading"] == "lines"
  for name in ("probes.md", "probes_categories.png", "probes_end_of_input.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0
  # a rerun scores nothing
  assert cli.main(argv) == 0
  assert "already scored" in capsys.readouterr().err
  merged = str(tmp_path / "merged")
  assert cli.main(["--merge=%s,%s" % ((os.path.join(out, "probes.json"),) * 2),
                   "--output=" + merged]) == 0
  with open(os.path.join(merged, "probes.json")) as f:
    assert len(json.load(f)["models"]) == 4


def test_cli_runs_perturbations_and_copy_on_the_same_targets(tiny, tmp_path):
  """The other probes on a real checkpoint: their unperturbed baselines are the token probe's
  figure at the largest N (the same targets, the same model)."""
  from routing_transformer.tools.probes import __main__ as cli
  vocab, ckpt, books = tiny
  out = str(tmp_path / "out")
  assert cli.main(["--books_dir=" + books, "--split=test", "--checkpoint=rt=" + ckpt,
                   "--hparams_set=" + SET, "--vocab=" + vocab, "--lengths=64", "--span=-30:-20",
                   "--profile=30", "--targets=40", "--bootstrap=20", "--batch_size=4",
                   "--output=" + out, "--probes=token,perturb,copy", "--perturb_m=16,34",
                   "--perturb_runs=1", "--perturb_kinds=shuffle,drop,drop_control",
                   "--copy_distances=16,34"]) == 0
  with open(os.path.join(out, "probes.json")) as f:
    rt = json.load(f)["models"]["rt"]
  token = rt["figures"]["64"]["categories"]["all"]
  for base in (rt["perturb"]["baseline"], rt["copy"]["baseline"]):
    assert base["tokens"] == token["tokens"] == 40
    assert base["nll"] == pytest.approx(token["nll"], rel=1e-6)
  assert set(rt["perturb"]["kinds"]) == {"shuffle", "drop", "drop_control"}
  assert rt["copy"]["distances"]["16"]["nll"] != token["nll"]
  for name in ("probes_perturbations.png", "probes_copy.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0


@pytest.mark.parametrize("extra, message", [
    (["--exclude=Moby Dick"], "--exclude=Moby Dick names no book"),
    (["--lengths=128"], "N=128 is above the model's length L=64; use prefix lengths <= 64"),
    (["--lengths=50", "--span=-60:-50"], "use N >= 60"),
    (["--split=validation"], "no <book_id>.txt books"),
    (["--checkpoint=x"], "write LABEL=CHECKPOINT"),
    (["--probes=token,perturb", "--perturb_m=60"], "--perturb_m: m=60 must be in 1..14"),
    (["--probes=token,copy,suffux"], "--probes=token,copy,suffux: give some of"),
])
def test_cli_bad_input_is_one_line(tiny, tmp_path, capsys, extra, message):
  from routing_transformer.tools.probes import __main__ as cli
  vocab, ckpt, books = tiny
  argv = ["--books_dir=" + books, "--split=test", "--checkpoint=rt=" + ckpt, "--hparams_set=" + SET,
          "--vocab=" + vocab, "--lengths=50,64", "--profile=50", "--targets=20",
          "--output=" + str(tmp_path / "o")]
  with pytest.raises(SystemExit) as e:
    cli.main(argv + extra)
  text = str(e.value.code)
  assert text.startswith("error: ") and message in text and "\n" not in text
