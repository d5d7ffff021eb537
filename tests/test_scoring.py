"""The scorer: windows, per-token log-likelihoods against the model run directly, word perplexity
by hand, spans, original-release names, and one-line errors."""
import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

import routing_transformer  # pylint: disable=unused-import
from routing_transformer.tools import checkpoints
from routing_transformer.t2t import model as model_lib
from routing_transformer.tools import score
from hparams import sets
from tensor2tensor.data_generators import problem_hparams
from tensor2tensor.data_generators import text_encoder

tf1 = tf.compat.v1
WORDS = "the cat sat on a mat while dogs ran far away from home and sang".split()
SET = "routing_transformer_test"  # max_target_length 64


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  counts = {w: 10 - i % 5 for i, w in enumerate(WORDS)}
  encoder = text_encoder.SubwordTextEncoder()
  encoder.build_from_token_counts(counts, min_count=1)
  path = str(tmp_path_factory.mktemp("vocab") / "vocab.subwords")
  encoder.store_to_file(path)
  return path


def write_model(directory, vocab_size, names=lambda n: n, zero_output_kernel=False, seed=0):
  """Random tiny model under our names (or `names(ours)`); returns {our name: value}."""
  hparams = sets.routing_transformer_test()
  with tf.Graph().as_default():
    tf1.set_random_seed(seed)
    p_hparams = problem_hparams.test_problem_hparams(vocab_size, vocab_size, hparams)
    model_lib.RoutingTransformer(hparams, tf.estimator.ModeKeys.EVAL, p_hparams)(
        {"targets": tf.zeros([1, 64, 1, 1], tf.int32)})
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      values = {v.op.name: sess.run(v) for v in tf1.global_variables()}
  rng = np.random.default_rng(seed)
  for name in values:
    if name.endswith("final_dense_2/bias"):
      values[name] = rng.normal(0, 2, values[name].shape).astype(np.float32)
    if name.endswith("final_dense_2/kernel") and zero_output_kernel:
      values[name] = np.zeros_like(values[name])
  os.makedirs(directory, exist_ok=True)
  checkpoints.write_checkpoint(os.path.join(directory, "model.ckpt-1"),
                               {names(n): v for n, v in values.items()})
  tf1.train.update_checkpoint_state(directory, os.path.join(directory, "model.ckpt-1"))
  return values


def direct_log_probs(directory, vocab_size, windows):
  """log p(ids[i] | ids[:i]) of each window run alone through the model (no scorer code)."""
  hparams = sets.routing_transformer_test()
  with tf.Graph().as_default():
    ids = tf1.placeholder(tf.int32, [1, None, 1, 1])
    p_hparams = problem_hparams.test_problem_hparams(vocab_size, vocab_size, hparams)
    logits, _ = model_lib.RoutingTransformer(hparams, tf.estimator.ModeKeys.EVAL, p_hparams)(
        {"targets": ids})
    with tf1.Session() as sess:
      tf1.train.Saver().restore(sess, tf.train.latest_checkpoint(directory))
      out = []
      for window in windows:
        x = sess.run(logits, {ids: np.asarray(window, np.int32)[None, :, None, None]})
        x = x.reshape(len(window), vocab_size).astype(np.float64)
        lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
        out.append(x[np.arange(len(window)), window] - lse)
  return out


def test_plan_windows_tiles_the_scored_tokens():
  assert score.plan_windows(10, 0, 4) == [(0, 4, 0), (4, 8, 4), (6, 10, 8)]
  assert score.plan_windows(10, 0, 4, stride=2) == [(0, 2, 0), (0, 4, 2), (2, 6, 4), (4, 8, 6),
                                                    (6, 10, 8)]
  assert score.plan_windows(10, 7, 4) == [(6, 10, 7)]  # span: window ends at the span's end
  assert score.plan_windows(3, 0, 4) == [(0, 3, 0)]
  with pytest.raises(score.ScorerError):
    score.plan_windows(10, 0, 4, stride=5)


def test_word_perplexity_matches_hand_computation(vocab_file, tmp_path):
  encoder = text_encoder.SubwordTextEncoder(vocab_file)
  values = write_model(str(tmp_path), encoder.vocab_size, zero_output_kernel=True)
  bias = next(v for n, v in values.items() if n.endswith("final_dense_2/bias")).astype(np.float64)
  log_p = bias - math.log(np.exp(bias).sum())  # logits = bias at every position
  texts = ["the cat sat on a mat", "dogs ran far away from home and sang " * 12]
  scorer = score.Scorer(str(tmp_path), SET, vocab_file, batch_size=2)
  result = scorer.summary(texts)
  ids = [encoder.encode(t.strip()) for t in texts]  # one line each, read stripped
  assert len(ids[1]) > 64  # the long text needs two windows
  nll = -sum(log_p[i].sum() for i in ids)
  words = 6 + 8 * 12
  assert result["words"] == words and result["tokens"] == sum(len(i) for i in ids)
  assert result["total_nll"] == pytest.approx(nll, rel=1e-5)
  assert result["word_perplexity"] == pytest.approx(math.exp(nll / words), rel=1e-5)
  assert result["bits_per_word"] == pytest.approx(nll / words / math.log(2), rel=1e-5)
  np.testing.assert_allclose(scorer.score(texts[:1])[0], log_p[ids[0]], rtol=1e-5)
  scorer.close()


def test_scores_equal_the_model_run_window_by_window(vocab_file, tmp_path):
  encoder = text_encoder.SubwordTextEncoder(vocab_file)
  write_model(str(tmp_path), encoder.vocab_size, seed=3)
  rng = np.random.default_rng(5)
  text = " ".join(rng.choice(WORDS, 70))
  prefix, span = " ".join(rng.choice(WORDS, 70)), " ".join(rng.choice(WORDS, 8))
  ids = encoder.encode(text)
  assert 64 < len(ids) <= 128
  joined = encoder.encode(prefix) + encoder.encode(span)
  assert len(joined) > 64  # the prefix is cut from the left
  scorer = score.Scorer(str(tmp_path), SET, vocab_file, batch_size=3)
  full, spanned = scorer.score([text])[0], scorer.score_span(prefix, span)
  short = scorer.score(["the cat"])[0]  # a padded window, batched with the others
  direct = direct_log_probs(str(tmp_path), encoder.vocab_size,
                            [ids[:64], ids[-64:], joined[-64:], encoder.encode("the cat")])
  np.testing.assert_allclose(full[:64], direct[0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(full[64:], direct[1][128 - len(ids):], rtol=1e-4, atol=1e-5)
  assert len(spanned) == len(encoder.encode(span))
  np.testing.assert_allclose(spanned, direct[2][-len(spanned):], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(short, direct[3], rtol=1e-4, atol=1e-5)
  scorer.close()


def test_original_release_names_restore_directly(vocab_file, tmp_path):
  encoder = text_encoder.SubwordTextEncoder(vocab_file)
  write_model(str(tmp_path / "ours"), encoder.vocab_size, seed=4)
  write_model(str(tmp_path / "orig"), encoder.vocab_size, names=checkpoints.to_original, seed=4)
  assert any("attention_nd" in n for n in checkpoints.read_variables(str(tmp_path / "orig")))
  texts = ["a cat ran home", "the dogs sang"]
  results = []
  # The original-release names run with routing_padding_as_original=True (test_routing_padding).
  for sub, overrides in (("ours", "routing_padding_as_original=True"), ("orig", "")):
    scorer = score.Scorer(str(tmp_path / sub), SET, vocab_file, overrides, batch_size=2)
    results.append(scorer.score(texts))
    scorer.close()
  for a, b in zip(*results):
    np.testing.assert_array_equal(a, b)


def test_cli_prints_json_and_one_line_errors(vocab_file, tmp_path, capsys):
  encoder = text_encoder.SubwordTextEncoder(vocab_file)
  write_model(str(tmp_path / "ckpt"), encoder.vocab_size, seed=6)
  text = tmp_path / "book.txt"
  text.write_text("the cat sat on a mat\nwhile dogs ran far away\n")
  base = ["--checkpoint", str(tmp_path / "ckpt"), "--hparams_set", SET, "--vocab", vocab_file]
  score.main(base + ["--text_file", str(text), "--span_start", "21", "--per_token"])
  entry = json.loads(capsys.readouterr().out)["files"][0]
  assert entry["words"] == 5 and entry["span_start"] == 21
  tokens = encoder.decode_list(encoder.encode("while dogs ran far away"))  # lines: no newline
  assert [t for t, _ in entry["per_token"]] == tokens
  assert entry["total_nll"] == pytest.approx(-sum(v for _, v in entry["per_token"]), rel=1e-5)
  with pytest.raises(score.ScorerError, match="pass --vocab"):
    score.load_encoder(None)
  with pytest.raises(score.ScorerError, match="unknown problem"):
    score.load_encoder(None, "no_such_problem")
  for args, message in [
      (["--vocab", str(tmp_path / "none")], "vocab file"),
      (["--checkpoint", str(tmp_path / "none")], "not found"),
      (["--hparams_set", "routing_transformer_tiny"], "shape mismatches"),
      (["--span_start", "999"], "span_start"),
      (["--reading", "whole_text"], None),
      (["--vocab", whole_text_vocab(tmp_path)], "built from whole texts"),
  ]:
    argv = base + ["--text_file", str(text)]
    for i in range(0, len(args), 2):
      if args[i] in argv:
        argv[argv.index(args[i]) + 1] = args[i + 1]
      else:
        argv += args[i:i + 2]
    if message is None:  # read whole: the newlines are encoded (as escapes)
      score.main(argv)
      tokens = json.loads(capsys.readouterr().out)["files"][0]["tokens"]
      assert tokens == len(encoder.encode(text.read_text())) > len(
          encoder.encode(text.read_text().replace("\n", " ")))
      continue
    with pytest.raises(SystemExit) as exit_info:
      score.main(argv)
    assert str(exit_info.value).startswith("error: ") and message in str(exit_info.value)
    assert "\n" not in str(exit_info.value)


def whole_text_vocab(tmp_path):
  """A vocabulary built from whole texts (newline tokens: it has newline-escape subwords)."""
  path = str(tmp_path / "whole.subwords")
  if not os.path.exists(path):
    counts = {w: 10 - i % 5 for i, w in enumerate(WORDS)}
    counts.update({"\n": 30, ".\n": 20})
    encoder = text_encoder.SubwordTextEncoder()
    encoder.build_from_token_counts(counts, min_count=1)
    encoder.store_to_file(path)
  return path


def test_scorer_reads_text_through_the_pg19_reading(vocab_file, tmp_path):
  """Scorer.encode = problems.pg19_reading.encode: by default each line stripped and encoded,
  joined (the ids T2T's own encoder gives line by line); whole_text keeps the newlines; the
  prefix of a span is read the same way; the scores are the model's on those ids."""
  from problems import pg19_reading  # pylint: disable=g-import-not-at-top
  encoder = text_encoder.SubwordTextEncoder(vocab_file)
  write_model(str(tmp_path), encoder.vocab_size, seed=2)
  text = "  the cat sat\n\n\ton a mat  \nwhile dogs ran\n"
  by_hand = encoder.encode("the cat sat") + encoder.encode("on a mat") + encoder.encode(
      "while dogs ran")
  scorer = score.Scorer(str(tmp_path), SET, vocab_file, batch_size=2)
  assert scorer.reading == "lines"
  assert scorer.encode(text) == by_hand == pg19_reading.encode(encoder, text)
  assert "\\10;" not in "".join(encoder.all_subtoken_strings[i] for i in by_hand)
  np.testing.assert_array_equal(scorer.score([text])[0], scorer.score_ids([(by_hand, 0)])[0])
  prefix, span = encoder.encode("the cat sat"), encoder.encode("on a mat")
  np.testing.assert_array_equal(scorer.score_span("the cat sat\n", "\ton a mat\n"),
                                scorer.score_ids([(prefix + span, len(prefix))])[0])
  scorer.close()
  whole = score.Scorer(str(tmp_path), SET, vocab_file, reading="whole_text")
  assert whole.encode(text) == encoder.encode(text) != by_hand
  assert "\\10;" in "".join(encoder.all_subtoken_strings[i] for i in whole.encode(text))
  whole.close()
  with pytest.raises(score.ScorerError, match="built from whole texts.*--reading=whole_text"):
    score.Scorer(str(tmp_path), SET, whole_text_vocab(tmp_path))
  with pytest.raises(score.ScorerError, match="use lines"):
    score.Scorer(str(tmp_path), SET, vocab_file, reading="words")


def test_scorer_takes_hparams_sets_from_a_user_dir(vocab_file, tmp_path):
  """--t2t_usr_dir: a user's set (here routing_transformer_test under another name) scores."""
  user = tmp_path / "usr"
  user.mkdir()
  (user / "__init__.py").write_text(
      "from tensor2tensor.utils import registry\nfrom hparams import sets\n\n\n"
      "@registry.register_hparams\ndef scoring_user_set():\n"
      "  return sets.routing_transformer_test()\n")
  encoder = text_encoder.SubwordTextEncoder(vocab_file)
  write_model(str(tmp_path / "ckpt"), encoder.vocab_size)
  text = "the cat sat on a mat"
  want = score.Scorer(str(tmp_path / "ckpt"), SET, vocab_file).score([text])[0]
  got = score.Scorer(str(tmp_path / "ckpt"), "scoring_user_set", vocab_file,
                     t2t_usr_dir=str(user)).score([text])[0]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  with pytest.raises(score.ScorerError, match="is not a directory"):
    score.Scorer(str(tmp_path / "ckpt"), SET, vocab_file, t2t_usr_dir=str(tmp_path / "nope"))


def test_scorer_checks_or_uses_the_hparams_json_beside_the_checkpoint(vocab_file, tmp_path):
  encoder = text_encoder.SubwordTextEncoder(vocab_file)
  write_model(str(tmp_path), encoder.vocab_size)
  stored = sets.routing_transformer_test().values()
  want = score.Scorer(str(tmp_path), SET, vocab_file).score(["the cat sat"])[0]
  with open(str(tmp_path / "hparams.json"), "w") as f:
    json.dump(dict(stored, filter_size=stored["filter_size"] + 8), f)
  with pytest.raises(score.ScorerError, match=r"in 1 hparam\(s\): filter_size \(hparams.json "
                     r"%d, --hparams_set=%s %d\)" % (stored["filter_size"] + 8, SET,
                                                     stored["filter_size"])):
    score.Scorer(str(tmp_path), SET, vocab_file)
  with open(str(tmp_path / "hparams.json"), "w") as f:
    json.dump(stored, f)
  got = score.Scorer(str(tmp_path), None, vocab_file, hparams_json="use").score(["the cat sat"])
  np.testing.assert_allclose(got[0], want, rtol=1e-6)  # built from the base set + hparams.json
