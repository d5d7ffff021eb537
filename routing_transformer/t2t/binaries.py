"""Tensor2Tensor's command-line binaries (`t2t-trainer`, `t2t-datagen`, `t2t-decoder`, ...) on TF2.

Tensor2Tensor 1.15.7 installs its binaries as small scripts that run
`tf.logging.set_verbosity(tf.logging.INFO)` and `tf.app.run()`. Two of them (`t2t-trainer`,
`t2t-datagen`) import `tensorflow.compat.v1 as tf`; the nine others import `tensorflow as tf`,
whose `logging` and `app` TensorFlow 2 removed, so they die at once with
"module 'tensorflow' has no attribute 'logging'".

This distribution declares a console script of the same name for each of the eleven
(pyproject.toml, `[project.scripts]`), each running the binary's `main` exactly as T2T's script
does, through `tensorflow.compat.v1`. pip writes console scripts when it installs a
distribution, so whichever of the two distributions is installed last owns the files:

- `pip install --no-deps -r requirements.txt .` (docs/install.md) installs `tensor2tensor` before
  `routing-transformer-tf`: pip installs the packages that declare no Requires-Python first
  (T2T 1.15.7 declares none, this project does), then each group in reverse order of names;
- `scripts/setup.sh` installs this project in the same command and checks `script_owner`;
- after installing or reinstalling `tensor2tensor` on its own, reinstall this project
  (`pip install --no-deps --force-reinstall .`, or `-e .` for a checkout) to take the scripts back.

Without Tensor2Tensor (the base profile on Python 3.12+) each command stops with one line naming
the `[t2t]` profile. Imports TensorFlow and Tensor2Tensor only when a command runs.
"""
import importlib
import importlib.util
import os
import sys

# command -> module whose main(argv) the T2T 1.15.7 script of that name runs.
BINARIES = {
    "t2t-avg-all": "tensor2tensor.bin.t2t_avg_all",
    "t2t-bleu": "tensor2tensor.bin.t2t_bleu",
    "t2t-datagen": "tensor2tensor.bin.t2t_datagen",
    "t2t-decoder": "tensor2tensor.bin.t2t_decoder",
    "t2t-eval": "tensor2tensor.bin.t2t_eval",
    "t2t-exporter": "tensor2tensor.serving.export",
    "t2t-insights-server": "tensor2tensor.insights.server",
    "t2t-make-tf-configs": "tensor2tensor.bin.make_tf_configs",
    "t2t-query-server": "tensor2tensor.serving.query",
    "t2t-trainer": "tensor2tensor.bin.t2t_trainer",
    "t2t-translate-all": "tensor2tensor.bin.t2t_translate_all",
}

MISSING = ("{command}: Tensor2Tensor is not installed. The T2T binaries come with the [t2t] "
           "profile on Python 3.11 (TensorFlow 2.15.1): see docs/install.md")


def run(command, modules=None):
  """Runs T2T's binary `command` as its own script does, with TF2's compat.v1 logging and app.

  `modules` maps commands to module names (default BINARIES). Returns the exit status a console
  script passes to sys.exit: 1 with one line on stderr when the module's top package is missing.
  """
  module_name = (modules or BINARIES)[command]
  if importlib.util.find_spec(module_name.split(".")[0]) is None:
    sys.stderr.write(MISSING.format(command=command) + "\n")
    return 1
  module = importlib.import_module(module_name)
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  tf.logging.set_verbosity(tf.logging.INFO)
  try:
    tf.app.run(main=module.main)  # absl: parses the flags, calls main(argv), exits
  except SystemExit as done:  # the status to the console script's sys.exit
    return done.code
  return 0


# The console scripts' functions (pyproject.toml's [project.scripts]).
def t2t_avg_all():
  return run("t2t-avg-all")


def t2t_bleu():
  return run("t2t-bleu")


def t2t_datagen():
  return run("t2t-datagen")


def t2t_decoder():
  return run("t2t-decoder")


def t2t_eval():
  return run("t2t-eval")


def t2t_exporter():
  return run("t2t-exporter")


def t2t_insights_server():
  return run("t2t-insights-server")


def t2t_make_tf_configs():
  return run("t2t-make-tf-configs")


def t2t_query_server():
  return run("t2t-query-server")


def t2t_trainer():
  return run("t2t-trainer")


def t2t_translate_all():
  return run("t2t-translate-all")


def script_owner(command, bin_dir=None):
  """'routing-transformer-tf' when the console script `command` in `bin_dir` (default: this
  interpreter's scripts folder) is ours, 'tensor2tensor' when it is T2T's own script, None when
  absent."""
  path = os.path.join(bin_dir or os.path.dirname(sys.executable), command)
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8", errors="replace") as f:
    text = f.read()
  if "routing_transformer.t2t.binaries" in text:
    return "routing-transformer-tf"
  return "tensor2tensor"
