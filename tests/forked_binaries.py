"""Stock t2t-trainer / t2t-decoder runs in processes forked from one that imported TF and T2T once.

A T2T binary spends ~20 s of a 2-core CPU importing TensorFlow and Tensor2Tensor (all of T2T's
models and problems) before it parses a flag, and the suite runs many. Here a multiprocessing
forkserver imports them once per pytest worker; each run is a new process forked from it that
runs the binary's `main` as the console script does (`routing_transformer.t2t.binaries.run`),
with its own argv, environment, working directory and output files, its own exit status, and can
be killed (SIGKILL) like any process. t2t-decoder's module imports t2t-trainer's, so one server
holds both; t2t-datagen defines the same flags as the trainer and runs as a real subprocess.
The installed console scripts themselves run as real subprocesses in the shared trained run
(conftest.trained_run) and the packaging tests.
"""
import multiprocessing
import os
import subprocess
import sys
import tempfile

FORKED = ("t2t-trainer", "t2t-decoder")
PRELOAD = ["tensorflow", "tensor2tensor.bin.t2t_decoder", "routing_transformer.t2t.binaries"]
_CONTEXT = []


def _context():
  if not _CONTEXT:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    _CONTEXT.append(context)
  return _CONTEXT[0]


def _main(command, argv, env, cwd, out_path, err_path):
  """The forked process: argv, environment, cwd and stdout / stderr files, then the binary."""
  os.chdir(cwd)
  os.environ.clear()
  os.environ.update(env)
  for fd, path in ((1, out_path), (2, err_path)):
    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(f, fd)
    os.close(f)
  sys.argv = [command] + list(argv)
  code = 1
  try:
    from routing_transformer.t2t import binaries  # pylint: disable=g-import-not-at-top
    code = binaries.run(command)
  except Exception:  # pylint: disable=broad-except
    sys.excepthook(*sys.exc_info())  # as the interpreter reports an uncaught exception
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
  sys.exit(code)


def start(command, argv, env, cwd, out_path, err_path=None):
  """Starts `command argv` in a forked process writing to out_path (and err_path, default the
  same file); returns the multiprocessing.Process (is_alive, kill, join, exitcode)."""
  assert command in FORKED, command
  err_path = err_path or out_path
  for path in {out_path, err_path}:
    open(path, "w").close()
  process = _context().Process(
      target=_main, args=(command, list(argv), dict(env), cwd, out_path, err_path))
  process.start()
  return process


def run(command, argv, env, cwd, timeout=600):
  """Runs `command argv` to its end: a subprocess.CompletedProcess (returncode, stdout, stderr);
  subprocess.TimeoutExpired after `timeout` seconds (the process killed)."""
  with tempfile.TemporaryDirectory() as folder:
    out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
    process = start(command, argv, env, cwd, out, err)
    process.join(timeout)
    if process.is_alive():
      process.kill()
      process.join()
      raise subprocess.TimeoutExpired([command] + list(argv), timeout)
    with open(out) as stdout, open(err) as stderr:
      return subprocess.CompletedProcess([command] + list(argv), process.exitcode,
                                         stdout.read(), stderr.read())
