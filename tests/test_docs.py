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


# ------------------------------------------------------------------------------------------------
# Commands, flags, runnable snippets and signatures shown in the docs, checked against the code.
#
# - Fenced blocks opened with ```python run are executed (from an empty temporary folder, so they
#   must work from anywhere once the project is installed); keep them to tiny shapes and seconds.
# - Command lines in code blocks and inline code (`python -m M`, `python path.py`, `.venv/bin/...`,
#   the rt-* commands of pyproject.toml, `t2t-datagen/-trainer/-decoder`, `make T VAR="..."`):
#   the module or script exists, every --flag is one its parser defines (argparse parsers are
#   captured from main() without running it; absl flags of routing_transformer.tools.evaluate via its
#   define_flags; T2T's from the binaries' own modules), literal values are among the choices /
#   of the type, and a make VAR=... assignment is used by the target's recipe, its flags parsed
#   by the script the recipe runs.
# - Calls to this project's functions and classes in ```python blocks and in backticked
#   `name(a, b, c=...)` spans bind to inspect.signature (a signature-shaped span, all bare names,
#   must name the parameters in order).
# - Output paths under demo_output/, benchmarks/results/, soak_output/ named in the docs are in
#   OUTPUT_PATHS, each checked against what the code writes.
# ------------------------------------------------------------------------------------------------
import argparse  # pylint: disable=g-import-not-at-top,wrong-import-position
import ast  # pylint: disable=g-import-not-at-top,wrong-import-position
import importlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import importlib.util  # pylint: disable=g-import-not-at-top,wrong-import-position
import inspect  # pylint: disable=g-import-not-at-top,wrong-import-position
import pkgutil  # pylint: disable=g-import-not-at-top,wrong-import-position
import subprocess  # pylint: disable=g-import-not-at-top,wrong-import-position
import sys  # pylint: disable=g-import-not-at-top,wrong-import-position
import tomllib  # pylint: disable=g-import-not-at-top,wrong-import-position
import warnings  # pylint: disable=g-import-not-at-top,wrong-import-position

RUNNABLE_FENCE = re.compile(r"^```python\s+run\s*$")
PYTHON_FENCE = re.compile(r"^```python\b")
SHELL_FENCE = re.compile(r"^```(bash|sh|shell|console)?\s*$")
T2T_BINARIES = ("t2t-datagen", "t2t-trainer", "t2t-decoder")
PROJECT_PACKAGES = ("routing_transformer", "problems", "hparams")


def code_blocks(path):
  """[(line, fence, body)] of the fenced blocks of one markdown file."""
  out = []
  for is_code, start, seg in segments(open(path, encoding="utf-8").read()):
    if is_code:
      lines = seg.split("\n")
      body = lines[1:-1] if lines[-1].strip().startswith("```") else lines[1:]
      out.append((start, lines[0].strip(), "\n".join(body)))
  return out


def runnable_snippets():
  return [(path, line, body) for path in doc_files()
          for line, fence, body in code_blocks(path) if RUNNABLE_FENCE.match(fence)]


def entry_points():
  """{command: "module:function"} of pyproject.toml's [project.scripts]."""
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]["scripts"]


# --- command lines --------------------------------------------------------------------------------

class Command(object):
  """One command line of the docs: program kind and target, its words, where it is."""

  def __init__(self, path, line, words):
    self.path, self.line, self.words = path, line, words

  def __repr__(self):
    return "%s:%d %s" % (rel(self.path), self.line, " ".join(self.words))


def shell_words(text):
  """Words of a command line, doc placeholders ([...] around options, `...`) removed."""
  text = text.replace("\\\n", " ")
  try:
    words = shlex.split(text, comments=True)
  except ValueError:
    words = text.split()
  out = []
  for word in words:
    word = word.strip("[]")
    if word and word != "...":
      out.append(word)
  return out


def split_commands(words):
  """A word list split at shell operators."""
  out, current = [], []
  for word in words:
    if word in ("&&", "||", ";", "|"):
      out.append(current)
      current = []
    else:
      current.append(word)
  out.append(current)
  return [c for c in out if c]


def command_lines(path):
  """Command lines of the shell code blocks and of inline code spans of one markdown file."""
  text = open(path, encoding="utf-8").read()
  out = []
  for is_code, start, seg in segments(text):
    if is_code:
      fence = seg.split("\n", 1)[0].strip()
      if not SHELL_FENCE.match(fence):
        continue
      body = seg.split("\n")[1:-1]
      joined, first = "", None
      for number, line in enumerate(body, start + 1):
        first = number if not joined else first
        joined += line + "\n"
        if line.rstrip().endswith("\\"):
          continue
        for words in split_commands(shell_words(joined)):
          out.append(Command(path, first, words))
        joined = ""
      continue
    for m in INLINE_CODE.finditer(seg):
      for words in split_commands(shell_words(m.group(1))):
        out.append(Command(path, line_of(start, seg, m.start()), words))
  return out


def classify(words):
  """(kind, target, args) of a command: ("module", M, args), ("script", path, args),
  ("entry", name, args), ("t2t", binary, args), ("make", target, args) or None."""
  words = list(words)
  while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value prefixes
    words.pop(0)
  if not words:
    return None
  program = os.path.basename(words[0])
  if program in ("python", "python3") or re.match(r"^python3\.\d+$", program):
    if len(words) > 2 and words[1] == "-m":  # this project's modules (not pytest, pip, ...)
      if words[2].split(".")[0] in PROJECT_PACKAGES + ("t2t_usr_dir",):
        return ("module", words[2], words[3:])
      return None
    if len(words) > 1 and words[1].endswith(".py"):
      return ("script", words[1], words[2:])
    return None
  if program in T2T_BINARIES:
    return ("t2t", program, words[1:])
  if program in entry_points():
    return ("entry", program, words[1:])
  if program == "make" and words[0] == "make":
    return ("make", words[1:], [])
  return None


def flag_uses(args):
  """[(name, value or None)] of the --flags in an argument list."""
  out = []
  for i, word in enumerate(args):
    m = re.match(r"^--([A-Za-z0-9_][A-Za-z0-9_\-]*)(?:=(.*))?$", word, re.S)
    if not m:
      continue
    value = m.group(2)
    if value is None and i + 1 < len(args) and not args[i + 1].startswith("-"):
      value = args[i + 1]
    out.append((m.group(1), value))
  return out


def literal(value):
  """A value written out in full (not a placeholder such as $DATA, <run>, D, {a,b})."""
  return value is not None and not re.search(r"[$<>{}]|\.\.\.", value)


class _Parsed(Exception):
  pass


def capture_parser(main):
  """The argparse parser main() builds, taken when main() first parses (nothing else runs)."""
  def grab(self, *unused_args, **unused_kwargs):
    raise _Parsed(self)

  saved_argv, saved_path = sys.argv, list(sys.path)
  original = argparse.ArgumentParser.parse_known_args
  argparse.ArgumentParser.parse_known_args = grab
  sys.argv = ["prog"]
  try:
    try:
      main([]) if inspect.signature(main).parameters else main()
    except _Parsed as e:
      return e.args[0]
  finally:
    argparse.ArgumentParser.parse_known_args = original
    sys.argv = saved_argv
    sys.path[:] = saved_path
  raise AssertionError("%s returned without parsing its arguments" % main)


class FlagSet(object):
  """The flags one command accepts: {name: (choices or None, type or None)}."""

  def __init__(self, flags, what):
    self.flags, self.what = flags, what

  def problems(self, uses):
    bad = []
    for name, value in uses:
      known = self.flags.get(name)
      if known is None and name.startswith("no") and self.flags.get(name[2:], (0, 0))[1] is bool:
        continue  # absl's --noflag
      if known is None:
        bad.append("--%s is not a flag of %s" % (name, self.what))
        continue
      choices, kind = known
      if not literal(value) or kind is bool:
        continue
      if choices and value not in choices:
        bad.append("--%s=%s is not one of %s (%s)" % (name, value, sorted(choices), self.what))
      elif kind in (int, float):
        try:
          kind(value)
        except ValueError:
          bad.append("--%s=%s is not %s (%s)" % (name, value, kind.__name__, self.what))
    return bad


def argparse_flags(parser, what):
  flags, defaults = {}, {}
  for option, action in parser._option_string_actions.items():  # pylint: disable=protected-access
    if option.startswith("--"):
      kind = bool if action.nargs == 0 else action.type
      flags[option[2:]] = (list(action.choices) if action.choices else None, kind)
      defaults[option[2:]] = action.default
  result = FlagSet(flags, what)
  result.defaults = defaults
  return result


def absl_flags(flag_values, what):
  from absl import flags as absl  # pylint: disable=g-import-not-at-top
  out = {}
  for name, flag in flag_values._flags().items():  # pylint: disable=protected-access
    kind = {absl.BooleanParser: bool, absl.IntegerParser: int, absl.FloatParser: float}.get(
        type(flag.parser))
    choices = getattr(flag.parser, "enum_values", None)
    out[name] = (list(choices) if choices else None, kind)
  return FlagSet(out, what)


def module_main(module):
  """The parser of a module's command: absl (define_flags) or argparse (captured from main)."""
  from absl import flags as absl  # pylint: disable=g-import-not-at-top
  if hasattr(module, "define_flags"):
    values = absl.FlagValues()
    module.define_flags(values)
    return absl_flags(values, module.__name__)
  assert hasattr(module, "main"), "%s has no main()" % module.__name__
  return argparse_flags(capture_parser(module.main), module.__name__)


def load_script(path):
  """The module of a script file, loaded under a private name (its __main__ block not run)."""
  name = "_doc_script_" + re.sub(r"\W", "_", os.path.relpath(path, ROOT))
  if name in sys.modules:
    return sys.modules[name]
  saved_path = list(sys.path)
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  with warnings.catch_warnings():
    spec.loader.exec_module(module)
  sys.path[:] = saved_path
  sys.modules[name] = module
  return module


# The flags of T2T's binaries: the DEFINE_* calls of each binary's module and of the T2T modules
# that define its flags (read from the installed source: importing the binaries would load every
# T2T model and problem, and t2t_datagen and t2t_trainer define some flags both).
T2T_FLAG_SOURCES = {
    "t2t-datagen": ["bin/t2t_datagen.py"],
    "t2t-trainer": ["bin/t2t_trainer.py", "utils/flags.py"],
    "t2t-decoder": ["bin/t2t_trainer.py", "utils/flags.py", "bin/t2t_decoder.py"],
}
ABSL_BUILTIN_FLAGS = ("help", "helpshort", "helpfull", "helpxml", "flagfile", "undefok")


def t2t_flags(binary):
  """FlagSet of a T2T binary from the DEFINE_* calls of its modules."""
  import tensor2tensor  # pylint: disable=g-import-not-at-top
  base = os.path.dirname(tensor2tensor.__file__)
  kinds = {"bool": bool, "boolean": bool, "integer": int, "float": float}
  flags = {name: (None, None) for name in ABSL_BUILTIN_FLAGS}
  for source in T2T_FLAG_SOURCES[binary]:
    tree = ast.parse(open(os.path.join(base, source), encoding="utf-8").read())
    for node in ast.walk(tree):
      if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and
              node.func.attr.startswith("DEFINE_") and node.args and
              isinstance(node.args[0], ast.Constant)):
        continue
      kind = node.func.attr[len("DEFINE_"):]
      choices = None
      if kind == "enum" and len(node.args) > 2:
        try:
          choices = list(ast.literal_eval(node.args[2]))
        except ValueError:
          choices = None
      flags[node.args[0].value] = (choices, kinds.get(kind))
  assert len(flags) > 20, (binary, flags)
  return FlagSet(flags, binary)


@pytest.fixture(scope="module")
def parsers():
  """Builds (once, lazily) the flag set of every command the docs show."""
  cache = {}

  def get(kind, target):
    key = (kind, target)
    if key in cache:
      return cache[key]
    if kind == "t2t":
      result = t2t_flags(target)
    elif kind == "module":
      spec = importlib.util.find_spec(target)
      assert spec is not None, "no module %s" % target
      if spec.submodule_search_locations is not None:  # a package: `python -m` runs __main__
        target += ".__main__"
      result = module_main(importlib.import_module(target))
    elif kind == "entry":
      module, _, function = entry_points()[target].partition(":")
      module = importlib.import_module(module)
      assert hasattr(module, function), "%s: %s has no %s()" % (target, module, function)
      result = module_main(module)
    elif kind == "script":
      path = os.path.join(ROOT, target)
      assert os.path.isfile(path), "no script %s (paths are from the repository root)" % target
      result = argparse_flags(capture_parser(load_script(path).main), target)
    else:
      raise ValueError(kind)
    cache[key] = result
    return result

  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  return get


def makefile_recipes():
  """{target: [recipe lines]} and {variable: value} of the Makefile."""
  recipes, variables, current = {}, {}, None
  with open(os.path.join(ROOT, "Makefile")) as f:
    for line in f:
      line = line.rstrip("\n")
      if line.startswith("\t") and current:
        for target in current:
          recipes[target].append(line.strip())
        continue
      m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*[:?]?=\s*(.*)$", line)
      if m:
        variables[m.group(1)] = m.group(2)
        current = None
        continue
      m = re.match(r"^([A-Za-z0-9_.\-][A-Za-z0-9_.\- ]*):(?!=)", line)
      if m and not line.startswith(".PHONY"):
        current = m.group(1).split()
        for target in current:
          recipes.setdefault(target, [])
      elif not line.strip():
        current = None
  return recipes, variables


def make_problems(words, get):
  """What is wrong with `make TARGET VAR="..."` (the target's existence: test_make_targets_exist)."""
  recipes, variables = makefile_recipes()
  targets = [w for w in words if not w.startswith("-") and "=" not in w]
  assignments = [w.split("=", 1) for w in words if "=" in w and not w.startswith("-")]
  bad = []
  for name, value in assignments:
    using = [line for t in targets for line in recipes.get(t, []) if "$(%s)" % name in line]
    if not using:
      bad.append("%s is not used by the recipe of %s" % (name, " ".join(targets)))
      continue
    for line in using:
      expanded = line.replace("$(%s)" % name, value)
      expanded = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), ""), expanded)
      for command in split_commands(shell_words(expanded)):
        parsed = classify(command)
        if parsed and parsed[0] in ("module", "script"):
          bad.extend(get(parsed[0], parsed[1]).problems(flag_uses(parsed[2])))
  return bad


def all_commands():
  return [c for path in doc_files() for c in command_lines(path) if classify(c.words)]


def test_commands_match_their_parsers(parsers):
  """Every command the docs show runs a module/script/binary that exists and accepts its flags."""
  commands = all_commands()
  kinds = {classify(c.words)[0] for c in commands}
  assert {"module", "script", "t2t", "make"} <= kinds and len(commands) > 40, commands
  bad = []
  for command in commands:
    kind, target, args = classify(command.words)
    try:
      if kind == "make":
        problems = make_problems(target, parsers)
      else:
        problems = parsers(kind, target).problems(flag_uses(args))
    except AssertionError as e:
      problems = [str(e).split("\n")[0]]
    bad.extend("%r: %s" % (command, p) for p in problems)
  assert not bad, "commands in README/docs that do not match the code:\n" + "\n".join(bad)


def test_command_checks_catch_drift(parsers, tmp_path):
  """A misspelt flag, a bad choice, an unused make variable, a missing script are all reported."""
  page = tmp_path / "page.md"
  page.write_text(
      "```bash\npython -m routing_transformer.tools.score --checkpoint c --text_fle a.txt\n"
      "python -m routing_transformer.tools.checkpoints --from a --to b --optimizer_slots=keep\n"
      "t2t-trainer --t2t_usr_dir=t2t_usr_dir --train_stpes=10\n"
      "python scripts/no_such_script.py\n```\n\n"
      "Run `make bench-train BENCH_ARGS=\"--stepz 3\"` or `make demo NO_SUCH_ARGS=1` or "
      "`python -m routing_transformer.tools.evaluate --splt=test`.\n")
  found = []
  for command in command_lines(str(page)):
    kind, target, args = classify(command.words)
    try:
      found += (make_problems(target, parsers) if kind == "make"
                else parsers(kind, target).problems(flag_uses(args)))
    except AssertionError as e:
      found.append(str(e))
  text = "\n".join(found)
  for needle in ("--text_fle", "keep", "--train_stpes", "no_such_script.py", "--stepz",
                 "NO_SUCH_ARGS", "--splt"):
    assert needle in text, (needle, text)


# --- runnable snippets ----------------------------------------------------------------------------

def test_runnable_snippets_run(tmp_path, monkeypatch):
  """Every ```python run block executes, from an empty folder (the installed package)."""
  snippets = runnable_snippets()
  assert snippets, "no ```python run blocks in README/docs"
  monkeypatch.chdir(tmp_path)
  for path, line, body in snippets:
    try:
      exec(compile(body, "%s:%d" % (rel(path), line), "exec"), {"__name__": "__doc_snippet__"})  # pylint: disable=exec-used
    except Exception as e:  # pylint: disable=broad-except
      pytest.fail("%s:%d: the runnable snippet fails: %s: %s" % (rel(path), line,
                                                                 type(e).__name__, e))


# --- signatures -----------------------------------------------------------------------------------

def project_index():
  """{"name", "module.name", "package.module.name", "Class.method": [objects]} of the project."""
  index = {}

  def add(key, obj):
    entries = index.setdefault(key, [])
    if not any(o is obj for o in entries):
      entries.append(obj)

  modules = []
  for package in PROJECT_PACKAGES:
    root = importlib.import_module(package)
    modules.append(root)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
      modules.append(importlib.import_module(info.name))
  for module in modules:
    short = module.__name__.rsplit(".", 1)[-1]
    for name, obj in vars(module).items():
      if name.startswith("_") or not callable(obj):
        continue
      home = getattr(obj, "__module__", "") or ""
      if not home.startswith(PROJECT_PACKAGES):
        continue
      for key in (name, short + "." + name, module.__name__ + "." + name):
        add(key, obj)
      if inspect.isclass(obj) and home == module.__name__:
        for method, function in vars(obj).items():
          if inspect.isfunction(function) and not method.startswith("_"):
            add(name + "." + method, function)
  return index


def call_name(node, aliases):
  """Dotted name of a call's function ("a.b.c"), import aliases of the snippet resolved."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name):
    return None
  parts.append(aliases.get(node.id, node.id))
  return ".".join(reversed(parts))


def snippet_aliases(tree):
  """{name: dotted name} of a snippet's imports, and {variable: "@" + dotted call} of its
  `variable = Something(...)` assignments (so `variable.method(...)` can be resolved)."""
  aliases = {}
  for node in ast.walk(tree):
    if (isinstance(node, ast.Assign) and len(node.targets) == 1 and
        isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)):
      aliases["@" + node.targets[0].id] = node.value.func
    if isinstance(node, ast.ImportFrom) and node.module:
      for alias in node.names:
        aliases[alias.asname or alias.name] = node.module + "." + alias.name
    elif isinstance(node, ast.Import):
      for alias in node.names:
        aliases[alias.asname or alias.name] = alias.name
  return aliases


def resolve_name(index, name):
  """The one project object a documented dotted name means, or None."""
  keys = [name]
  if name.split(".")[0] in PROJECT_PACKAGES:
    keys.append(name.split(".", 1)[1])
  for key in keys:
    if index.get(key):
      return index[key][0] if len(index[key]) == 1 else None
  return None


def signature_problem(node, obj, span=False):
  """Why the call `node` does not fit obj's signature, or None."""
  try:
    signature = inspect.signature(obj)
  except (TypeError, ValueError):
    return None
  partial = any(isinstance(a, ast.Starred) or (isinstance(a, ast.Constant) and a.value is ...)
                for a in node.args) or any(k.arg is None for k in node.keywords)
  args = [a for a in node.args if not (isinstance(a, ast.Constant) and a.value is ...)
          and not isinstance(a, ast.Starred)]
  kwargs = {k.arg: None for k in node.keywords if k.arg}
  try:
    (signature.bind_partial if partial else signature.bind)(*args, **kwargs)
  except TypeError as e:
    return "%s%s: %s" % (getattr(obj, "__qualname__", obj), signature, e)
  if span and all(isinstance(a, ast.Name) for a in node.args):
    names = [p.name for p in signature.parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if [a.id for a in node.args] != names[:len(node.args)]:
      return "%s%s: documented as (%s)" % (getattr(obj, "__qualname__", obj), signature,
                                           ", ".join(a.id for a in node.args))
  return None


def documented_calls():
  """[(where, call node, aliases, is_span)]: calls in ```python blocks and backticked f(...)."""
  out = []
  for path in doc_files():
    for line, fence, body in code_blocks(path):
      if not PYTHON_FENCE.match(fence):
        continue
      try:
        tree = ast.parse(body)
      except SyntaxError as e:
        out.append(("%s:%d" % (rel(path), line), e, {}, False))
        continue
      aliases = snippet_aliases(tree)
      for node in ast.walk(tree):
        if isinstance(node, ast.Call):
          out.append(("%s:%d" % (rel(path), line + node.lineno), node, aliases, False))
    for is_code, start, seg in segments(open(path, encoding="utf-8").read()):
      if is_code:
        continue
      for m in INLINE_CODE.finditer(seg):
        span = " ".join(m.group(1).split())
        if not re.match(r"^[A-Za-z_][\w.]*\(.*\)$", span):
          continue
        try:
          node = ast.parse(span, mode="eval").body
        except SyntaxError:
          continue
        if isinstance(node, ast.Call):
          out.append(("%s:%d" % (rel(path), line_of(start, seg, m.start())), node, {}, True))
  return out


def test_documented_signatures_match(parsers):  # parsers: t2t_usr_dir imported first
  index = project_index()
  bad, checked = [], 0
  for where, node, aliases, span in documented_calls():
    if isinstance(node, SyntaxError):
      bad.append("%s: a ```python block that is not Python: %s" % (where, node))
      continue
    name = call_name(node.func, aliases)
    if not name:
      continue
    owner = aliases.get("@" + name.split(".")[0]) if name.count(".") == 1 else None
    if owner is not None:  # instance.method(...): the method of the class that made it
      made = resolve_name(index, call_name(owner, aliases) or "")
      if made is not None and inspect.isclass(made):
        name = "%s.%s" % (made.__name__, name.split(".")[1])
        node = ast.Call(func=node.func, args=[ast.Name(id="self")] + node.args,
                        keywords=node.keywords)
    objects = None
    keys = [name]  # "package.module.f" (import aliases resolved), "module.f", "f"
    if name.split(".")[0] in PROJECT_PACKAGES:
      keys.append(name.split(".", 1)[1])
    for key in keys:
      objects = index.get(key)
      if objects:
        break
    if not objects or len(objects) > 1:
      continue  # not this project's, or ambiguous (e.g. a method name of several classes)
    checked += 1
    problem = signature_problem(node, objects[0], span)
    if problem:
      bad.append("%s: %s" % (where, problem))
  assert checked > 10, "the signature check found almost nothing (%d calls)" % checked
  assert not bad, "calls in README/docs that do not match the code:\n" + "\n".join(bad)


def test_signature_check_catches_drift(parsers):
  index = project_index()
  node = ast.parse("analysis.head_focus(weights, kinds)", mode="eval").body
  assert "head_focus" in signature_problem(node, index["analysis.head_focus"][0], span=True)
  tree = ast.parse("from routing_transformer.tools.score import Scorer\ns = Scorer(c, h, v)\n"
                   "s.score_span(prefix)\n")
  aliases = snippet_aliases(tree)
  call = tree.body[-1].value
  made = resolve_name(index, call_name(aliases["@s"], aliases))
  assert made.__name__ == "Scorer"
  method = index["Scorer.score_span"][0]
  call = ast.Call(func=call.func, args=[ast.Name(id="self")] + call.args, keywords=[])
  assert "span" in signature_problem(call, method)
  node = ast.parse("analysis.head_focus(probs, valid, kinds, threshold=0.1)", mode="eval").body
  assert signature_problem(node, index["analysis.head_focus"][0], span=True) is None


# --- repository layout ----------------------------------------------------------------------------

def layout_covered():
  """Paths docs/layout.md covers: a row's backticked paths, names after the first resolved
  against its folder; folders (trailing /) cover everything under them."""
  covered = set()
  text = open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8").read()
  for line in text.split("\n"):
    if not line.startswith("| `"):
      continue
    first_cell = line.split("|")[1]
    folder = ""
    for name in INLINE_CODE.findall(first_cell) + INLINE_CODE.findall(line.split("|")[2]):
      if "/" in name.rstrip("/"):
        folder = name.rsplit("/", 1)[0] + "/" if not name.endswith("/") else ""
      candidates = [name, folder + name] if folder and "/" not in name.rstrip("/") else [name]
      covered.update(c for c in candidates if os.path.exists(os.path.join(ROOT, c)))
  return covered


def test_layout_covers_every_file():
  files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout
  covered = layout_covered()
  assert len(covered) > 20, covered
  missing = [f for f in files.split() if not f.startswith("docs/") and f not in covered and not
             any(f.startswith(c) for c in covered if c.endswith("/"))]
  assert not missing, "files docs/layout.md does not mention: %s" % missing


# --- output paths ---------------------------------------------------------------------------------

OUTPUT_PATH = re.compile(r"(?<![\w/.])((?:demo_output|benchmarks/results|soak_output)"
                         r"(?:/[A-Za-z0-9_.<>{},*\-]+)*/?)")
# The commands that write under those folders: (script, its output flag, the modules whose code
# names the files it writes, names that stand for a <placeholder> or a run: module constants).
WRITERS = [
    ("scripts/demo.py", "output", ["scripts/demo.py", "scripts/t2t_runs.py",
                                   "routing_transformer/tools/analysis.py",
                                   "routing_transformer/tools/probes/demo.py"], "MODELS"),
    ("scripts/demo_long_range.py", "output", ["scripts/demo_long_range.py",
                                              "scripts/t2t_runs.py",
                                              "routing_transformer/tools/analysis.py"], "MODELS"),
    ("benchmarks/attention.py", "out", ["benchmarks/attention.py"], None),
    ("benchmarks/train_step.py", "out", ["benchmarks/train_step.py"], None),
    ("benchmarks/train_memory.py", "out", ["benchmarks/train_memory.py"], None),
    ("benchmarks/decode.py", "out", ["benchmarks/decode.py"], None),
    ("benchmarks/peers.py", "out", ["benchmarks/peers.py"], None),
    ("scripts/soak.py", "output_dir", ["scripts/soak.py"], None),
]


def string_constants(path):
  return {node.value for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read()))
          if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def output_mentions():
  out = []
  for path in doc_files():
    for number, line in enumerate(open(path, encoding="utf-8").read().split("\n"), 1):
      for m in OUTPUT_PATH.finditer(line):
        out.append(("%s:%d" % (rel(path), number), m.group(1).rstrip(".,;:)")))
  return out


def path_written(mention, writers):
  """Whether some writer's default output folder + names from its code give `mention`."""
  for root, constants, stems in writers:
    for path in expand(mention):
      if not (path + "/").startswith(root + "/"):
        continue
      rest = [p for p in path[len(root):].split("/") if p]
      if all(part_written(part, constants, stems) for part in rest):
        return True
  return False


def part_written(part, constants, stems):
  """One path component: a constant of the code, a stem (run/task name or a <placeholder> for
  one), or a stem followed by a constant suffix ("routing" + ".decodes.tsv")."""
  if part in constants or part in stems or (stems and re.match(r"^<\w+>$", part)):
    return True
  for stem in list(stems) + (["<x>"] if stems else []):
    head = re.match(r"^(<\w+>|%s)(\..+)$" % re.escape(stem), part)
    if head and head.group(2) in constants:
      return True
  return False


def writers(parsers):
  out = []
  for script, flag, sources, stems_name in WRITERS:
    default = parsers("script", script).defaults[flag]
    constants = set().union(*[string_constants(s) for s in sources])
    stems = set()
    if stems_name:
      value = getattr(load_script(os.path.join(ROOT, script)), stems_name)
      stems = {v[0] if isinstance(v, tuple) else v for v in value}
    out.append((os.path.relpath(default, ROOT), constants, stems))
  return out


def test_output_paths_are_what_the_code_writes(parsers):
  found = writers(parsers)
  mentions = output_mentions()
  assert len(mentions) > 10, mentions
  bad = ["%s: %s" % (where, path) for where, path in mentions if not path_written(path, found)]
  assert not bad, ("output paths in README/docs that no command writes (its default output "
                   "folder and the names in its code):\n" + "\n".join(bad))


def test_output_path_check_catches_drift(parsers):
  found = writers(parsers)
  for path in ("demo_output/<model>.decodes.tsv", "benchmarks/results/attention.svg",
               "demo_output/long_range/analysis/head_jss.md"):
    assert not path_written(path, found), path
  for path in ("demo_output/long_range/<model>.decodes.tsv", "soak_output/report.json",
               "benchmarks/results/attention.{json,png}",
               "demo_output/analysis/head_focus.md"):
    assert path_written(path, found), path


# --- flags and defaults named in prose ------------------------------------------------------------

CLI_REFERENCE = re.compile(r"`(?:\.venv/bin/)?(?:python -m )?((?:scripts|benchmarks)/\w+\.py|"
                           r"(?:routing_transformer|problems)\.\w+(?:\.\w+)?|rt-[a-z]+)`")
PROSE_FLAG = re.compile(r"`--(\w+)(?:[= ][^`]*)?`(?:,? \(?(?:default:?|defaults to) "
                        r"([\w.\-]+))?")


def prose_flag_mentions():
  """[(where, (kind, target), flag, documented default or None)]: `--flags` in paragraphs that
  name exactly one command (a script, a module with a main, an rt-* command)."""
  out = []
  for path in doc_files():
    for is_code, start, seg in segments(open(path, encoding="utf-8").read()):
      if is_code:
        continue
      offset = 0
      for paragraph in re.split(r"\n\s*\n|\n(?=\s*- )", seg):  # paragraphs, list items
        first = line_of(start, seg, seg.index(paragraph, offset))
        offset = seg.index(paragraph, offset) + len(paragraph)
        targets = set()
        for m in CLI_REFERENCE.finditer(paragraph):
          name = m.group(1)
          if name.startswith("rt-"):
            if name in entry_points():
              targets.add(("entry", name))
          elif name.endswith(".py"):
            targets.add(("script", name))
          elif os.path.isfile(os.path.join(ROOT, *name.split("."))[:] + ".py"):
            targets.add(("module", name))
        if len(targets) != 1:
          continue
        target = targets.pop()
        for m in PROSE_FLAG.finditer(paragraph):
          out.append(("%s:%d" % (rel(path), line_of(first, paragraph, m.start())), target,
                      m.group(1), m.group(2)))
  return out


def test_prose_flags_and_defaults_match(parsers):
  """A `--flag` in a paragraph about one command is one of its flags; a stated default is its."""
  bad, checked = [], 0
  for where, (kind, target), flag, default in prose_flag_mentions():
    if kind == "module":
      module = importlib.import_module(target)
      if hasattr(module, "__path__") and importlib.util.find_spec(target + ".__main__"):
        module = importlib.import_module(target + ".__main__")  # `python -m package`
      if not hasattr(module, "main"):
        continue  # an API module named beside a flag of another command
    flags = parsers(kind, target)
    checked += 1
    if flag not in flags.flags:
      bad.append("%s: --%s is not a flag of %s" % (where, flag, target))
    elif default is not None and hasattr(flags, "defaults"):
      actual = flags.defaults[flag]
      if str(actual) != default.replace(",", "") and not (
          isinstance(actual, str) and actual.endswith(default)):
        bad.append("%s: --%s default %s documented, %s in %s" % (where, flag, default, actual,
                                                                 target))
  assert checked > 5, "the prose flag check found almost nothing"
  assert not bad, "flags/defaults in README/docs prose that differ from the code:\n" + "\n".join(
      bad)
