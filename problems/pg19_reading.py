"""How PG-19 text becomes token ids: the one reading of datagen (`problems.pg19`), the scorer
(`routing_transformer.tools.score`) and the probes (`routing_transformer.tools.probes`).

LINES, the default, is the original release's (`Pg19Length8k` in its `problems/pg19.py`, which
reads a book with T2T's `txt_line_iterator`): the text is split at "\\n", each line is stripped
(`str.strip`) and encoded on its own, and the lines' ids are joined with nothing between them, so
no newline ever reaches the vocabulary and blank lines add nothing. The vocabulary is built from
the same stripped lines (`vocab_pieces`), as the released `vocab.pg19_length8k.32768.subwords`
was. Datagen packs a book's lines greedily, whole, into examples of at most `length` tokens
(`pack`).

WHOLE_TEXT encodes the text at once, newlines included (T2T's SubwordTextEncoder writes every
newline as the escape `\\10;`): for vocabularies built that way, as this project's PG-19 data was
before it read lines (the demo's earlier runs). Name it: `PG19_READING=whole_text` for datagen,
`reading="whole_text"` / `--reading=whole_text` for the scorer and the probes. Reading a
vocabulary built from whole texts with LINES is refused (`check_vocabulary`).

Unlike the original (one stream of all books, EOS at the end of every example), each book ends
with one EOS and no example holds parts of two books; a line longer than an example is cut.
"""
from tensor2tensor.data_generators import text_encoder

from problems.errors import DataError

LINES = "lines"
WHOLE_TEXT = "whole_text"
READINGS = (LINES, WHOLE_TEXT)
NEWLINE_ESCAPE = "\\10;"  # "\n" as T2T's subword encoder escapes it (text_encoder._escape_token)


def check(reading):
  """`reading` if it is one of READINGS, else a DataError naming them."""
  if reading not in READINGS:
    raise DataError("PG-19 reading %r: use %s (each line stripped and encoded, the original "
                    "release's) or %s (the text with its newlines, for vocabularies built that "
                    "way)" % (reading, LINES, WHOLE_TEXT))
  return reading


def pieces(text, reading=LINES):
  """The strings encoded one by one: LINES: the stripped, non-empty lines of `text` (split at
  "\\n" only); WHOLE_TEXT: [text] (nothing for an empty text)."""
  if check(reading) == WHOLE_TEXT:
    return [text] if text else []
  return [line for line in (raw.strip() for raw in text.split("\n")) if line]


def _encode_piece(encoder):
  """The encoder's own encode of one piece (an `Encoder` reads text; its pieces go through the
  plain subword encoding)."""
  return getattr(encoder, "encode_piece", encoder.encode)


def encode_pieces(encoder, text, reading=LINES):
  """[ids (list of int) of each piece of `text`] (see `pieces`)."""
  encode_one = _encode_piece(encoder)
  return [list(encode_one(p)) for p in pieces(text, reading)]


def encode(encoder, text, reading=LINES):
  """Token ids (list of int) of `text`: the ids of its pieces, joined."""
  return [i for ids in encode_pieces(encoder, text, reading) for i in ids]


def pack(pieces_ids, length, eos_id=None):
  """Examples of one book: its pieces' ids packed greedily, whole, into lists of <= `length`.

  A piece joins the current example when it fits, else it starts the next one; a piece longer
  than `length` is cut into windows of `length` and its last, shorter window starts the next
  example. `eos_id` (when given) ends the book as a one-token piece of its own. WHOLE_TEXT
  (one piece) therefore gives consecutive windows of `length` of the book's ids plus EOS.

  Args:
    pieces_ids: [list of int] (e.g. `encode_pieces`).
    length: the longest example.
    eos_id: id appended after the last piece, or None.
  Returns:
    [list of int], every one non-empty and at most `length` long; their concatenation is the
    pieces' ids (plus EOS).
  """
  if length < 1:
    raise ValueError("length=%d: examples need at least one token" % length)
  pieces_ids = [list(p) for p in pieces_ids if len(p)]
  if eos_id is not None:
    pieces_ids.append([eos_id])
  examples, current = [], []
  for piece in pieces_ids:
    if len(current) + len(piece) <= length:
      current.extend(piece)
      continue
    if current:
      examples.append(current)
    while len(piece) > length:
      examples.append(piece[:length])
      piece = piece[length:]
    current = piece
  if current:
    examples.append(current)
  return examples


def vocab_pieces(texts, reading=LINES, max_chars=None):
  """The strings a vocabulary is built from: the pieces of `texts` (iterable of str), cut so that
  at most `max_chars` characters are yielded in all (None: no limit)."""
  chars = 0
  for text in texts:
    for piece in pieces(text, reading):
      if max_chars is not None and chars >= max_chars:
        return
      if max_chars is not None:
        piece = piece[:max_chars - chars]
      chars += len(piece)
      yield piece


def newline_subwords(encoder):
  """The encoder's subwords holding the newline escape `\\10;`: a vocabulary built from whole
  texts has them, one built from stripped lines has none (empty for non-subword encoders)."""
  return [s for s in getattr(encoder, "all_subtoken_strings", None) or () if NEWLINE_ESCAPE in s]


def check_vocabulary(encoder, reading, fix):
  """DataError when `reading` is LINES but the vocabulary was built from whole texts (it has
  newline subwords): its model was trained on text with newlines. `fix` names the option that
  selects WHOLE_TEXT (e.g. "PG19_READING=whole_text")."""
  found = newline_subwords(encoder) if check(reading) == LINES else []
  if found:
    raise DataError("the vocabulary was built from whole texts (it has newline subwords such as "
                    "%r) but the text is read as stripped lines; read it as it was built with "
                    "%s, or use a vocabulary built from stripped lines" % (found[0], fix))


class Encoder(text_encoder.SubwordTextEncoder):
  """The PG-19 problems' targets encoder: a SubwordTextEncoder whose encode(text) reads `text`
  with `reading` (so t2t-decoder prompts are read as the books were); `encode_piece` is the plain
  subword encoding. The vocabulary file is T2T's, unchanged."""

  def __init__(self, filename=None, reading=LINES, fix="PG19_READING=whole_text"):
    self.reading = check(reading)
    self.fix = fix
    self.checked = False
    super().__init__(filename)

  def encode_piece(self, s):
    return super().encode(s)

  def encode(self, s):
    if not self.checked:
      check_vocabulary(self, self.reading, self.fix)
      self.checked = True
    return encode(self, s, self.reading)
