"""Score text with a trained (or converted released) model: per-token log-likelihoods, perplexity.

    scorer = Scorer("ckpt_dir", "pg19_local_cluster8k", "vocab.pg19_length8k.32768.subwords")
    scorer.score(["text one", "text two"])      # -> [np.array of log p(token) in nats, ...]
    scorer.score_span(prefix, span)             # -> log p(span tokens | prefix)
    scorer.summary([text])                      # -> total NLL, token/word perplexity, bits

    python -m routing_transformer.tools.score --checkpoint DIR --hparams_set pg19_local_cluster8k \\
        --vocab vocab.pg19_length8k.32768.subwords --text_file book.txt \\
        [--span_start C --span_end C] [--t2t_usr_dir DIR,...]

The model is built once in its own tf.compat.v1 graph and session (exactly how T2T restores
checkpoints); callers pass strings and get numpy arrays. Checkpoints written by t2t-trainer under
`routing_transformer/` or `sparse_transformer/`, and original-release checkpoints (renamed in
memory through `checkpoints.LEGACY_NAMES`), are all restored; original-release ones (raw or
converted) route padding as the original code did (hparam routing_padding_as_original).

Windows. The model sees at most L = max_target_length tokens. The tokens to score are cut into
consecutive chunks of `stride` tokens (default L); each chunk is scored in one window of at most
L tokens that ends where the chunk ends. With the default stride every chunk but the last is
scored exactly as the model was trained and as the paper evaluated: non-overlapping examples of
L tokens, no state carried across them, the first token predicted from the start symbol. The
last, shorter chunk keeps the preceding tokens as context instead of padding (texts shorter than L
are padded). stride < L gives sliding windows where every scored token sees at least L - stride
tokens of context (when there are that many). With routing_mode="topk" (the paper and the
released model) cluster membership is chosen over the whole window, so a token's score may depend
on later tokens of its window, as in the paper's evaluation; "causal_window" models are causal.
"""
import argparse
import json
import sys

import numpy as np
import tensorflow as tf

from routing_transformer.tools import checkpoints
from routing_transformer.t2t import perplexity
from routing_transformer.t2t import usr_dirs

tf1 = tf.compat.v1


class ScorerError(ValueError):
  """Bad scorer input (checkpoint, vocabulary, hparams, span); the message names the fix."""


def plan_windows(num_tokens, first, length, stride=None):
  """Windows that score tokens [first, num_tokens) of a sequence.

  Args:
    num_tokens: n, tokens in the sequence.
    first: index of the first token to score (tokens before it are context only).
    length: L, the model's window.
    stride: chunk size (1..L); default L.
  Returns:
    [(start, end, score_from)]: run the model on ids[start:end] (end - start <= L) and keep the
    log-likelihoods of positions score_from..end-1; the chunks [score_from, end) tile [first, n).
  """
  stride = stride or length
  if not 0 < stride <= length:
    raise ScorerError("stride=%d must be in 1..max_target_length=%d" % (stride, length))
  out = []
  for a in range(first, num_tokens, stride):
    b = min(a + stride, num_tokens)
    out.append((max(0, b - length), b, a))
  return out


def load_encoder(vocab, problem=None, data_dir=None):
  """The targets encoder: a SubwordTextEncoder from a vocab file path (local or gs://), `vocab`
  itself if it is an encoder, or (vocab None) the registered T2T `problem`'s encoder."""
  from tensor2tensor.data_generators import text_encoder  # pylint: disable=g-import-not-at-top
  if vocab is None and problem:
    import problems  # pylint: disable=g-import-not-at-top,unused-import
    from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
    try:
      return registry.problem(problem).feature_encoders(data_dir)["targets"]
    except LookupError:
      raise ScorerError("unknown problem %r; see t2t-trainer --registry_help" % problem)
  if vocab is None:
    raise ScorerError("pass --vocab (the subword vocab file) or --problem with --data_dir")
  if not isinstance(vocab, str):
    return vocab
  if not tf.io.gfile.exists(vocab):
    raise ScorerError("vocab file %s not found; pass the model's subword vocabulary (the released "
                      "PG-19 model's is vocab.pg19_length8k.32768.subwords)" % vocab)
  return text_encoder.SubwordTextEncoder(vocab)


def encode_text(encoder, text, pg19_lines=False):
  """Token ids of `text`; pg19_lines: like the original PG-19 data (stripped lines, joined)."""
  if not pg19_lines:
    return list(encoder.encode(text))
  ids = []
  for line in text.split("\n"):
    ids.extend(encoder.encode(line.strip()))
  return ids


def original_padding(hparams):
  """Sets routing_padding_as_original=True on `hparams` (an original-release checkpoint: padding
  takes part in routing as in the original code); returns the line saying so."""
  if "routing_padding_as_original" in hparams.values():
    hparams.set_hparam("routing_padding_as_original", True)
  else:
    hparams.add_hparam("routing_padding_as_original", True)
  return ("original-release checkpoint: routing_padding_as_original=True (padding takes part in "
          "cluster membership and k-means statistics, as in the original code; override with "
          "--hparams=routing_padding_as_original=False)")


def restore_map(graph_variables, stored):
  """{checkpoint name: variable} for our variables, trying our names then the original release's.

  Raises ScorerError listing missing variables and shape mismatches.
  """
  var_list, missing, mismatched = {}, [], []
  for v in graph_variables:
    name = v.op.name
    rest = name.split("/", 1)[1] if "/" in name else name
    for candidate in (name, "sparse_transformer/" + rest, "routing_transformer/" + rest,
                      checkpoints.to_original(name)):
      if candidate in stored:
        break
    else:
      missing.append(name)
      continue
    if tuple(stored[candidate][0]) != tuple(v.shape.as_list()):
      mismatched.append("%s %s vs model %s" % (candidate, list(stored[candidate][0]),
                                                v.shape.as_list()))
    var_list[candidate] = v
  if missing or mismatched:
    parts = []
    if missing:
      parts.append("missing in the checkpoint (%d): %s" % (len(missing), ", ".join(missing[:10])))
    if mismatched:
      parts.append("shape mismatches (%d): %s" % (len(mismatched), ", ".join(mismatched[:10])))
    raise ScorerError("the checkpoint does not fit --hparams_set (%s); use the set it was trained "
                      "with" % "; ".join(parts))
  return var_list


class Scorer(object):
  """Per-token log-likelihoods of texts under a checkpoint (numpy in, numpy out)."""

  def __init__(self, checkpoint, hparams_set, vocab=None, hparams="", batch_size=1, stride=None,
               model="routing_transformer", pg19_lines=False, append_eos=False, problem=None,
               data_dir=None, t2t_usr_dir=None, hparams_json="check"):
    """Builds the model and restores the checkpoint.

    Args:
      checkpoint: checkpoint prefix or directory (ours or the original release's names).
      hparams_set: registered hparams set name, or an HParams object.
      vocab: subword vocab file path, or a T2T TextEncoder (None: the problem's encoder).
      hparams: "k=v,..." overrides of the set. An original-release checkpoint
        (`checkpoints.is_original_release`: original names, or written by the converter) runs
        with routing_padding_as_original=True unless these name it; `notes` says so.
      batch_size: windows per session run.
      stride: chunk size for long texts (see module docstring); default max_target_length.
      model: "routing_transformer" or "sparse_transformer" (graph scope; both restore any names).
      pg19_lines: encode like the original PG-19 data (each line stripped, lines joined).
      append_eos: score an EOS after each text (the PG-19 examples end with one).
      problem, data_dir: a registered T2T problem whose targets encoder (read from data_dir)
        is used when `vocab` is None.
      t2t_usr_dir: comma-separated user directories to import first (their problems and
        hparams sets), as the T2T binaries' --t2t_usr_dir.
      hparams_json: what to do with an hparams.json beside the checkpoint: "check" it against
        the hparams (one report of every difference), "use" it to build them, or "ignore" it.
    """
    from routing_transformer.t2t import model as model_lib  # pylint: disable=g-import-not-at-top
    from tensor2tensor.data_generators import problem_hparams  # pylint: disable=g-import-not-at-top
    try:
      usr_dirs.import_usr_dirs(t2t_usr_dir)
    except usr_dirs.UsrDirError as e:
      raise ScorerError(str(e))
    try:
      self.checkpoint = checkpoints.find_checkpoint(checkpoint)
    except checkpoints.CheckpointError as e:
      raise ScorerError(str(e))
    self.encoder = load_encoder(vocab, problem, data_dir)
    try:
      self.hparams = checkpoints.resolve_hparams(self.checkpoint, hparams_set, hparams,
                                                 hparams_json, t2t_usr_dir)
    except checkpoints.CheckpointError as e:
      raise ScorerError(str(e))
    if self.hparams is None:
      raise ScorerError("pass --hparams_set (the set the checkpoint was trained with) or "
                        "--hparams_json=use")
    try:
      model_lib.check_hparams(self.hparams)
    except model_lib.HParamsError as e:
      raise ScorerError(str(e))
    self.length = self.hparams.max_target_length or self.hparams.max_length
    self.batch_size, self.stride = batch_size, stride
    self.pg19_lines, self.append_eos = pg19_lines, append_eos
    plan_windows(0, 0, self.length, stride)  # validates stride

    stored = checkpoints.read_variables(self.checkpoint)
    self.notes = []  # lines about how the checkpoint is run (the CLI's JSON "notes")
    if checkpoints.has_routing_heads(self.hparams) and \
        "routing_padding_as_original" not in (hparams if isinstance(hparams, str) else "") and \
        checkpoints.is_original_release(self.checkpoint, stored):
      self.notes.append(original_padding(self.hparams))
    rows = [shape[0] for name, (shape, _) in stored.items()
            if name.endswith("/body/embeddings/embedding")]
    if not rows:
      raise ScorerError("%s has no <model>/body/embeddings/embedding; is it a Routing Transformer "
                        "checkpoint?" % self.checkpoint)
    self.vocab_size = rows[0]
    if self.encoder.vocab_size > self.vocab_size:
      raise ScorerError("the vocabulary has %d tokens but the checkpoint's embedding only %d; pass "
                        "the vocab file the model was trained with"
                        % (self.encoder.vocab_size, self.vocab_size))
    cls = {"routing_transformer": model_lib.RoutingTransformer,
           "sparse_transformer": model_lib.SparseTransformer}[model]
    self.graph = tf.Graph()
    with self.graph.as_default():
      p_hparams = problem_hparams.test_problem_hparams(self.vocab_size, self.vocab_size,
                                                       self.hparams)
      self.ids = tf1.placeholder(tf.int32, [batch_size, self.length], name="ids")
      net = cls(self.hparams, tf.estimator.ModeKeys.EVAL, p_hparams)
      logits, _ = net({"targets": self.ids[:, :, tf.newaxis, tf.newaxis]})
      logits = tf.cast(tf.reshape(logits, [batch_size, self.length, self.vocab_size]),
                       tf.float32)
      log_probs = tf.nn.log_softmax(logits)
      self.token_log_probs = tf.gather(log_probs, self.ids, axis=2, batch_dims=2)
      # Only the rows asked for: log_softmax over [batch, K, vocab] instead of [batch, L, vocab].
      self.positions = tf1.placeholder(tf.int32, [batch_size, None], name="positions")
      picked = tf.gather(logits, self.positions, axis=1, batch_dims=1)
      picked_ids = tf.gather(self.ids, self.positions, axis=1, batch_dims=1)
      self.position_log_probs = tf.gather(tf.nn.log_softmax(picked), picked_ids, axis=2,
                                          batch_dims=2)
      var_list = restore_map(tf1.global_variables(), stored)
      self.session = tf1.Session(graph=self.graph)
      tf1.train.Saver(var_list=var_list).restore(self.session, self.checkpoint)

  def encode(self, text):
    """Token ids of one text (with EOS when append_eos)."""
    ids = encode_text(self.encoder, text, self.pg19_lines)
    return ids + [1] if self.append_eos else ids  # T2T's EOS_ID

  def score_ids(self, sequences):
    """Log-likelihoods of token id sequences.

    Args:
      sequences: list of (ids, first): score ids[first:] given ids[:first].
    Returns:
      list of float32 arrays [len(ids) - first] (natural log).
    """
    jobs = []  # (sequence index, window ids, positions to keep within the window, output slot)
    for i, (ids, first) in enumerate(sequences):
      if any(t <= 0 or t >= self.vocab_size for t in ids[first:]):
        raise ScorerError("token ids must be in 1..%d (0 is padding)" % (self.vocab_size - 1))
      for start, end, keep in plan_windows(len(ids), first, self.length, self.stride):
        jobs.append((i, ids[start:end], keep - start, keep - first))
    out = [np.zeros(len(ids) - first, np.float32) for ids, first in sequences]
    for b in range(0, len(jobs), self.batch_size):
      batch = jobs[b:b + self.batch_size]
      feed = np.zeros([self.batch_size, self.length], np.int32)
      for row, (_, window, _, _) in enumerate(batch):
        feed[row, :len(window)] = window
      values = self.session.run(self.token_log_probs, {self.ids: feed})
      for row, (i, window, keep, slot) in enumerate(batch):
        part = values[row, keep:len(window)]
        out[i][slot:slot + len(part)] = part
    return out

  def log_probs_at(self, ids, positions):
    """log p(ids[b, p] | ids[b, :p]) at given positions, one pass per row, rows batched.

    Args:
      ids: int [B, N] token ids, N <= L (right-padded with 0 to L; 0 may also appear inside
        a row, e.g. dropped tokens: it is padding to the model).
      positions: int [B, K] positions within the rows (0 <= p < N).
    Returns:
      float32 [B, K] log-likelihoods in nats.
    """
    ids = np.asarray(ids, np.int32)
    positions = np.asarray(positions, np.int32)
    if ids.ndim != 2 or positions.ndim != 2 or len(ids) != len(positions):
      raise ScorerError("ids [B, N] and positions [B, K] need the same B (got shapes %s, %s)"
                        % (ids.shape, positions.shape))
    num, n = ids.shape
    if n > self.length:
      raise ScorerError("inputs of %d tokens exceed the model's length L=%d (max_target_length);"
                        " use N <= %d" % (n, self.length, self.length))
    if positions.size and (positions.min() < 0 or positions.max() >= n):
      raise ScorerError("positions must be in 0..%d (the input length N=%d)" % (n - 1, n))
    if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
      raise ScorerError("token ids must be in 0..%d" % (self.vocab_size - 1))
    out = np.zeros(positions.shape, np.float32)
    for b in range(0, num, self.batch_size):
      rows = slice(b, min(b + self.batch_size, num))
      feed = np.zeros([self.batch_size, self.length], np.int32)
      feed[:rows.stop - b, :n] = ids[rows]
      pos = np.zeros([self.batch_size, positions.shape[1]], np.int32)
      pos[:rows.stop - b] = positions[rows]
      values = self.session.run(self.position_log_probs, {self.ids: feed, self.positions: pos})
      out[rows] = values[:rows.stop - b]
    return out

  def score(self, texts):
    """[np.float32 array of log p(token | previous tokens)] per text, in nats."""
    return self.score_ids([(self.encode(t), 0) for t in texts])

  def score_spans(self, pairs):
    """[log-likelihoods of the span's tokens given the prefix] for (prefix, span) pairs.

    Prefix and span are encoded separately (so the span's tokens do not depend on the prefix);
    the window ends at the span's end, and a prefix longer than the window is cut from the left.
    """
    sequences = []
    for prefix, span in pairs:
      prefix_ids = encode_text(self.encoder, prefix, self.pg19_lines) if prefix else []
      sequences.append((prefix_ids + self.encode(span), len(prefix_ids)))
    return self.score_ids(sequences)

  def score_span(self, prefix, span):
    return self.score_spans([(prefix, span)])[0]

  def summary(self, texts, log_likelihoods=None):
    """perplexity.summary over texts: total NLL, tokens, words, token/word perplexity, bits."""
    if log_likelihoods is None:
      log_likelihoods = self.score(texts)
    total = -float(sum(np.sum(x, dtype=np.float64) for x in log_likelihoods))
    tokens = sum(len(x) for x in log_likelihoods)
    return perplexity.summary(total, tokens, sum(perplexity.count_words(t) for t in texts))

  def close(self):
    self.session.close()


def read_text(path):
  if not tf.io.gfile.exists(path):
    raise ScorerError("text file %s not found" % path)
  with tf.io.gfile.GFile(path, "rb") as f:
    return f.read().decode("utf-8")


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog="python -m routing_transformer.tools.score",
      description="Per-token log-likelihoods and word-level perplexity of text files.")
  parser.add_argument("--checkpoint", required=True, help="checkpoint prefix or directory")
  parser.add_argument("--hparams_set", default=None,
                      help="the checkpoint's hparams set (optional with --hparams_json=use)")
  parser.add_argument("--hparams", default="")
  parser.add_argument("--vocab", default=None, help="subword vocab file")
  parser.add_argument("--problem", default=None,
                      help="instead of --vocab: a T2T problem's encoder (e.g. pg19_length8k)")
  parser.add_argument("--data_dir", default=None, help="data_dir of --problem (its vocab)")
  parser.add_argument("--text_file", required=True, action="append",
                      help="text file to score (repeatable)")
  parser.add_argument("--span_start", type=int, default=None,
                      help="score only text[span_start:span_end] (characters) given the text "
                           "before it (one --text_file)")
  parser.add_argument("--span_end", type=int, default=None)
  parser.add_argument("--batch_size", type=int, default=1)
  parser.add_argument("--stride", type=int, default=None)
  parser.add_argument("--pg19_lines", action="store_true",
                      help="encode like the original PG-19 data (stripped lines joined)")
  parser.add_argument("--append_eos", action="store_true")
  parser.add_argument("--hparams_json", default="check", choices=["check", "use", "ignore"],
                      help="hparams.json beside the checkpoint: check it against --hparams_set "
                           "(default), use it to build the hparams, or ignore it")
  parser.add_argument("--t2t_usr_dir", default=None,
                      help="comma-separated user directories (their problems and hparams sets)")
  parser.add_argument("--per_token", action="store_true",
                      help="also print every token and its log-likelihood")
  args = parser.parse_args(argv)
  try:
    texts = [read_text(p) for p in args.text_file]
    span = args.span_start is not None or args.span_end is not None
    if span:
      if len(texts) != 1:
        raise ScorerError("--span_start/--span_end need exactly one --text_file")
      start = args.span_start or 0
      end = len(texts[0]) if args.span_end is None else args.span_end
      if not 0 <= start < end <= len(texts[0]):
        raise ScorerError("need 0 <= span_start < span_end <= %d (characters of the file)"
                          % len(texts[0]))
      pairs = [(texts[0][:start], texts[0][start:end])]
    scorer = Scorer(args.checkpoint, args.hparams_set, args.vocab, args.hparams,
                    args.batch_size, args.stride, pg19_lines=args.pg19_lines,
                    append_eos=args.append_eos, problem=args.problem, data_dir=args.data_dir,
                    t2t_usr_dir=args.t2t_usr_dir, hparams_json=args.hparams_json)
    if span:
      scores, texts = scorer.score_spans(pairs), [pairs[0][1]]
    else:
      scores = scorer.score(texts)
    result = {"files": []}
    for path, text, values in zip(args.text_file, texts, scores):
      entry = dict(file=path, **scorer.summary([text], [values]))
      if span:
        entry.update(span_start=start, span_end=end)
      if args.per_token:
        ids = scorer.encode(text)
        entry["per_token"] = [[scorer.encoder.decode_list([t])[0], float(v)]
                              for t, v in zip(ids, values)]
      result["files"].append(entry)
    if len(texts) > 1:
      result["total"] = scorer.summary(texts, scores)
    if scorer.notes:
      result["notes"] = scorer.notes
  except (ScorerError, ValueError, tf.errors.OpError) as e:
    sys.exit("error: %s" % (e.message if isinstance(e, tf.errors.OpError) else e))
  print(json.dumps(result, indent=1))
  return 0


if __name__ == "__main__":
  main()
