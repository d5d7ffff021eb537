"""Perplexity arithmetic shared by the evaluation tools and the scorer (word-level
perplexity as the paper reports it for PG-19).

Word-level perplexity of a subword or byte model is exp(total cross-entropy over a split, in
nats / number of words in the split): the model's total NLL is spread over the words of the
text, whatever the tokenisation. Words are counted the way the PG-19 statistics are: runs of
non-whitespace characters (`str.split()`).
"""
import math

# Official PG-19 statistics (Rae et al., 2020): books and words per split.
PG19_BOOKS = {"train": 28602, "validation": 50, "test": 100}
PG19_WORDS = {"train": 1973136207, "validation": 3007061, "test": 6966499}

LN2 = math.log(2.0)


def count_words(text):
  """Number of whitespace-separated words of `text` (str or bytes)."""
  if isinstance(text, bytes):
    text = text.decode("utf-8", errors="replace")
  return len(text.split())


def _checked(total_nll, count, what):
  if count <= 0:
    raise ValueError("Cannot compute a per-%s figure over %d %ss; the split is empty."
                     % (what, count, what))
  if not math.isfinite(total_nll):
    raise ValueError("The total cross-entropy is %r; the scores are not finite." % total_nll)
  return float(total_nll) / count


def perplexity(total_nll, count, what="token"):
  """exp(total_nll / count): total_nll in nats over `count` units (tokens or words)."""
  return math.exp(_checked(total_nll, count, what))


def bits_per_unit(total_nll, count, what="token"):
  """total_nll / (count * ln 2): bits per token, per byte, per word or per dimension."""
  return _checked(total_nll, count, what) / LN2


def summary(total_nll, num_tokens, num_words=None):
  """Dict of the figures a language-model evaluation reports.

  Args:
    total_nll: summed cross-entropy in nats over the scored tokens.
    num_tokens: number of scored tokens (subwords, bytes or pixels).
    num_words: number of words of the text the tokens encode, or None (no word figures).
  Returns:
    {"total_nll", "tokens", "nll_per_token", "token_perplexity", "bits_per_token"} plus
    {"words", "word_perplexity", "bits_per_word"} when `num_words` is given.
  """
  out = {
      "total_nll": float(total_nll),
      "tokens": int(num_tokens),
      "nll_per_token": _checked(total_nll, num_tokens, "token"),
      "token_perplexity": perplexity(total_nll, num_tokens),
      "bits_per_token": bits_per_unit(total_nll, num_tokens),
  }
  if num_words is not None:
    out.update(words=int(num_words),
               word_perplexity=perplexity(total_nll, num_words, "word"),
               bits_per_word=bits_per_unit(total_nll, num_words, "word"))
  return out
