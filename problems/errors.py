"""The one error type of the data problems: a message that names the expected files and the fix."""
import tensorflow.compat.v1 as tf


class DataError(ValueError):
  """Raw data or generated records are missing, empty or in the wrong format.

  The stock T2T binaries print it as one line (see `routing_transformer.t2t.glue`).
  """
  one_line = True


def require_dir(path, what, how_to_get):
  """Raises DataError unless `path` is an existing directory (local or gs://)."""
  if not path or not tf.io.gfile.isdir(path):
    raise DataError("%s: directory %r not found. %s" % (what, path, how_to_get))
  return path


def require_file(path, what, how_to_get):
  """Raises DataError unless `path` is an existing, non-empty file."""
  if not path or not tf.io.gfile.exists(path):
    raise DataError("%s: file %r not found. %s" % (what, path, how_to_get))
  if tf.io.gfile.isdir(path):
    raise DataError("%s: %r is a directory, expected a file. %s" % (what, path, how_to_get))
  if tf.io.gfile.stat(path).length == 0:
    raise DataError("%s: file %r is empty. %s" % (what, path, how_to_get))
  return path


def first_existing(candidates):
  """The first path of `candidates` that exists, or None."""
  for path in candidates:
    if path and tf.io.gfile.exists(path):
      return path
  return None
