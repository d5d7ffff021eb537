"""README.md and docs/*.md name only things that exist, link only to files that exist.

Names are collected from
  - flags, anywhere (prose and code): `--hparams_set=X`, `--problem=X`, `--model=X` (or a space);
  - table columns headed "problem" or "hparams set(s)": every backticked name in them;
  - backticked names (and quoted strings in code blocks) of this project's name families
    (`pg19_...`, `enwik8_...`, `routing_transformer...`, ...), and bare words of those families
    in prose;
and `{a,b}` patterns are expanded (`cifar10_routing_h{2,4,8}_l{2,4,8,12}_w{512,1024}` is 24 sets).
Each must be registered in T2T's registry once `t2t_usr_dir` is imported (names T2T registers
itself count too). `make X` (in backticks or code blocks, or hyphenated in prose) must be a target
of the Makefile. Relative links and their #anchors must resolve, every docs page must be reachable
from the README, and the README stays a front page: at most 10,000 characters, starting with
`make demo` and `make test`.
"""
import glob
import os
import re
import shlex

import pytest

from conftest import ROOT

README = os.path.join(ROOT, "README.md")
MAX_README_CHARS = 10000

FAMILY = re.compile(r"^(pg19_|enwik8_|wikitext103_|cifar10_|imagenet|mtf_|synthetic_|"
                    r"routing_transformer|local_transformer|sparse_transformer)")
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FLAG = re.compile(r"--(hparams_set|problem|model)(?:=|[ \t]+)[\"']?([A-Za-z0-9_{},]+)")
COLUMN_KINDS = [(re.compile(r"^hparams[ _]sets?$"), "hparams"),
                (re.compile(r"^problems?$"), "problem")]
INLINE_CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
BARE_FAMILY_WORD = re.compile(
    r"(?<![\w./\-])((?:pg19_|enwik8_|wikitext103_|cifar10_|imagenet|mtf_|synthetic_|"
    r"routing_transformer|local_transformer|sparse_transformer)[A-Za-z0-9_{},]*)(?![\w/\-]|\.\w)")
PROSE_MAKE = re.compile(r"\bmake ([a-z0-9]+(?:-[a-z0-9]+)+)\b")
QUOTED = re.compile(r"[\"']([A-Za-z0-9_{},]+)[\"']")


def doc_files():
  return [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def rel(path):
  return os.path.relpath(path, ROOT)


def expand(pattern):
  """Shell-style brace expansion: "a{1,2}b{x,y}" -> [a1bx, a1by, a2bx, a2by]."""
  match = re.search(r"\{([^{}]*)\}", pattern)
  if not match:
    return [pattern]
  head, tail = pattern[:match.start()], pattern[match.end():]
  return [name for option in match.group(1).split(",") for name in expand(head + option + tail)]


def segments(text):
  """[(is_code, first_line_number, text)]: fenced code blocks and the prose between them."""
  out, block, start, in_code = [], [], 1, False
  for number, line in enumerate(text.split("\n"), 1):
    if line.lstrip().startswith("```"):
      if in_code:
        block.append(line)
        out.append((True, start, "\n".join(block)))
        block, start, in_code = [], number + 1, False
      else:
        out.append((False, start, "\n".join(block)))
        block, start, in_code = [line], number, True
    else:
      block.append(line)
  out.append((in_code, start, "\n".join(block)))
  return out


def line_of(segment_start, text, offset):
  return segment_start + text.count("\n", 0, offset)


class Mention(object):

  def __init__(self, path, line, kind, name, how):
    self.path, self.line, self.kind, self.name, self.how = path, line, kind, name, how

  def __repr__(self):
    return "%s:%d %s %r (%s)" % (rel(self.path), self.line, self.kind, self.name, self.how)


def table_mentions(path, start, text):
  """Backticked names in the columns of markdown tables headed "problem" / "hparams set(s)"."""
  lines = text.split("\n")
  out, kinds = [], None
  for i, line in enumerate(lines):
    if not line.lstrip().startswith("|"):
      kinds = None
      continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if kinds is None:  # header row
      kinds = {}
      for column, cell in enumerate(cells):
        header = cell.replace("`", "").strip().lower()
        for pattern, kind in COLUMN_KINDS:
          if pattern.match(header):
            kinds[column] = kind
      continue
    if set(line.replace("|", "").strip()) <= set("-: "):
      continue  # separator row
    for column, kind in kinds.items():
      if column >= len(cells):
        continue
      for span in INLINE_CODE.findall(cells[column]):
        out.append(Mention(path, start + i, kind, span, "table column"))
  return out


def make_targets_in(command):
  """Targets of one `make ...` command line (options and VAR=value assignments skipped)."""
  try:
    words = shlex.split(command, comments=True)
  except ValueError:
    words = command.split()
  targets = []
  for word in words[1:]:
    if word in ("&&", "||", ";", "|"):
      break
    if word.startswith("-") or "=" in word:
      continue
    targets.append(word)
  return targets


def mentions(path):
  """Every hparams set / problem / model / make target named in one markdown file."""
  text = open(path, encoding="utf-8").read()
  out = []
  for is_code, start, seg in segments(text):
    for m in FLAG.finditer(seg):
      kind = {"hparams_set": "hparams"}.get(m.group(1), m.group(1))
      out.append(Mention(path, line_of(start, seg, m.start()), kind, m.group(2), "flag"))
    if is_code:
      for number, line in enumerate(seg.split("\n")):
        stripped = line.strip()
        if stripped.startswith("make "):
          for target in make_targets_in(stripped):
            out.append(Mention(path, start + number, "make", target, "code block"))
        for m in QUOTED.finditer(line):
          if FAMILY.match(m.group(1)):
            out.append(Mention(path, start + number, "name", m.group(1), "quoted in code"))
      continue
    out.extend(table_mentions(path, start, seg))
    for m in INLINE_CODE.finditer(seg):
      span = " ".join(m.group(1).split())
      line = line_of(start, seg, m.start())
      if span.startswith("make "):
        for target in make_targets_in(span):
          out.append(Mention(path, line, "make", target, "inline code"))
      elif FAMILY.match(span) and all(IDENTIFIER.match(n) for n in expand(span)):
        out.append(Mention(path, line, "name", span, "inline code"))
    prose = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), seg)
    prose = LINK.sub(lambda m: " " * len(m.group(0)), prose)
    for m in BARE_FAMILY_WORD.finditer(prose):
      out.append(Mention(path, line_of(start, seg, m.start()), "name", m.group(1), "prose"))
    for m in PROSE_MAKE.finditer(prose):
      out.append(Mention(path, line_of(start, seg, m.start()), "make", m.group(1), "prose"))
  return out


def all_mentions():
  return [m for path in doc_files() for m in mentions(path)]


def makefile_targets():
  targets = set()
  with open(os.path.join(ROOT, "Makefile")) as f:
    for line in f:
      m = re.match(r"^([A-Za-z0-9_.\-][A-Za-z0-9_.\- ]*):(?!=)", line)
      if m and not line.startswith((".PHONY", "\t")):
        targets.update(m.group(1).split())
  return targets


def _registered():
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  return {"hparams": set(registry.list_hparams()),
          "problem": set(registry.list_base_problems()),
          "model": set(registry.list_models())}


@pytest.fixture(scope="module")
def registered():
  """Registered names after importing t2t_usr_dir (T2T's own models/problems loaded lazily)."""
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  state = {"names": _registered(), "with_t2t": False}

  def lookup():
    return state["names"]

  def load_t2t():
    if not state["with_t2t"]:
      # What the stock binaries import: T2T's models (and their hparams sets) and problems.
      from tensor2tensor import models  # pylint: disable=g-import-not-at-top,unused-import
      from tensor2tensor.data_generators import all_problems  # pylint: disable=g-import-not-at-top
      all_problems.import_modules(all_problems.ALL_MODULES)
      state["names"], state["with_t2t"] = _registered(), True
    return state["names"]

  lookup.load_t2t = load_t2t
  return lookup


def is_registered(names, kind, name):
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  if kind == "problem":
    return registry.parse_problem_name(name).base_name in names["problem"]
  if kind == "name":
    return any(is_registered(names, k, name) for k in ("hparams", "problem", "model"))
  return name in names[kind]


def test_names_exist(registered):
  mentioned = [m for m in all_mentions() if m.kind != "make"]
  assert len(mentioned) > 50, "the extraction found almost nothing: %r" % mentioned

  def missing(names):
    return [(m, n) for m in mentioned for n in expand(m.name)
            if not IDENTIFIER.match(n) or not is_registered(names, m.kind, n)]

  bad = missing(registered())
  if bad:
    bad = missing(registered.load_t2t())
  assert not bad, "names in README/docs that are not registered:\n" + "\n".join(
      "%r: %s" % (m, n) for m, n in bad)


def test_every_family_name_is_checked():
  """The pattern expands to the whole CIFAR-10 grid, and the key sets are all found."""
  names = {n for m in all_mentions() for n in expand(m.name)}
  grid = expand("cifar10_routing_h{2,4,8}_l{2,4,8,12}_w{512,1024}")
  assert len(grid) == 24 and set(grid) <= names
  for name in ("pg19_local_cluster8k", "pg19_length8k", "synthetic_long_range",
               "routing_transformer_tiny", "local_transformer_tiny", "routing_transformer_mtf",
               "mtf_pg19_local_cluster8k", "imagenet64_pixels", "wikitext103_length2k"):
    assert name in names, name


def test_make_targets_exist():
  targets = makefile_targets()
  assert {"demo", "test", "setup"} <= targets, targets
  named = [m for m in all_mentions() if m.kind == "make"]
  assert {m.name for m in named} >= {"demo", "test"}
  bad = [m for m in named if m.name not in targets]
  assert not bad, "make targets in README/docs missing from the Makefile: %r (Makefile: %s)" % (
      bad, sorted(targets))


def slug(heading):
  """GitHub's anchor for a heading: the rendered text, lower case, punctuation dropped."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links -> their text
  text = text.replace("`", "").strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(path):
  out, seen = set(), {}
  for is_code, _, seg in segments(open(path, encoding="utf-8").read()):
    if is_code:
      continue
    for line in seg.split("\n"):
      m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
      if m:
        base = slug(m.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else "%s-%d" % (base, count))
  return out


def links(path):
  """[(line, target)] of the markdown links and images outside code."""
  out = []
  for is_code, start, seg in segments(open(path, encoding="utf-8").read()):
    if is_code:
      continue
    prose = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), seg)
    for m in LINK.finditer(prose):
      out.append((line_of(start, prose, m.start()), m.group(1)))
  return out


def resolve(path, target):
  """(file the link points to, anchor or None); None for external links."""
  if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
    return None
  file_part, _, anchor = target.partition("#")
  dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
  return dest, anchor or None


def test_relative_links_resolve():
  bad, count = [], 0
  for path in doc_files():
    for line, target in links(path):
      resolved = resolve(path, target)
      if resolved is None:
        continue
      count += 1
      dest, anchor = resolved
      where = "%s:%d %s" % (rel(path), line, target)
      if not os.path.exists(dest):
        bad.append(where + ": no such file")
      elif not dest.startswith(ROOT + os.sep):
        bad.append(where + ": outside the repository")
      elif anchor and (not dest.endswith(".md") or anchor not in anchors(dest)):
        bad.append(where + ": no heading with that anchor")
  assert count > 20, "the link extraction found almost nothing"
  assert not bad, "broken links:\n" + "\n".join(bad)


def test_every_docs_page_is_reachable_from_the_readme():
  seen, todo = set(), [README]
  while todo:
    path = todo.pop()
    if path in seen:
      continue
    seen.add(path)
    for _, target in links(path):
      resolved = resolve(path, target)
      if resolved and resolved[0].endswith(".md") and os.path.exists(resolved[0]):
        todo.append(resolved[0])
  unreached = [rel(p) for p in doc_files() if p not in seen]
  assert not unreached, "docs pages no link leads to from README.md: %s" % unreached


def test_readme_is_a_front_page():
  text = open(README, encoding="utf-8").read()
  assert len(text) <= MAX_README_CHARS, (
      "README.md has %d characters (at most %d): move details to docs/" % (
          len(text), MAX_README_CHARS))
  first_code = next(seg for is_code, _, seg in segments(text) if is_code)
  assert "\n##" not in text[:text.index(first_code)], "README must start with the two commands"
  commands = [l.split("#")[0].strip() for l in first_code.split("\n")[1:-1] if l.strip()]
  commands = [c for c in commands if c]
  assert commands[:2] == ["make demo", "make test"], commands


def test_extraction_catches_a_misspelt_name(tmp_path):
  """A misspelt set, problem or target in each kind of place is found (and reported)."""
  page = tmp_path / "page.md"
  page.write_text(
      "Run `make tset` or make bench-qualty.\n\n"
      "| problem | hparams set |\n|---|---|\n| `pg19_lenght8k` | `pg19_local_clustr8k` |\n\n"
      "Prose `enwik8_local_cluster8kk` and imagenet_local1dd and "
      "`cifar10_routing_h{2,3}_l2_w512`.\n\n"
      "```bash\nt2t-trainer --problem=synthetic_long_rnage --hparams_set routing_transformer_tiniy\n"
      "make demoo DEMO_ARGS=\"--steps 10\"\n```\n")
  found = {(m.kind, m.name) for m in mentions(str(page))}
  assert found >= {("make", "tset"), ("make", "bench-qualty"), ("problem", "pg19_lenght8k"),
                   ("hparams", "pg19_local_clustr8k"), ("name", "enwik8_local_cluster8kk"),
                   ("name", "imagenet_local1dd"), ("name", "cifar10_routing_h{2,3}_l2_w512"),
                   ("problem", "synthetic_long_rnage"), ("hparams", "routing_transformer_tiniy"),
                   ("make", "demoo")}, found
  assert ("make", "DEMO_ARGS") not in found
