"""Checkpoint files: find, list, write, and check that a graph can restore one.

Reads with `tf.train.load_checkpoint` (tf.io.gfile: local or gs:// paths). Knows nothing about the
model, so the model (restore check) and the converter (`checkpoints`) both import it.
"""
import os

import tensorflow as tf

tf1 = tf.compat.v1


class CheckpointError(ValueError):
  """A checkpoint that cannot be converted or restored; the message names the fix."""


class CheckpointMismatchError(CheckpointError):
  """A checkpoint in the output directory cannot be restored into the model being built."""
  one_line = True


def find_checkpoint(path):
  """A checkpoint prefix from a prefix or a directory (latest checkpoint); clear error if none."""
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
      found = tf.io.gfile.glob(os.path.join(path, "*.index"))
      if not found:
        raise CheckpointError("no checkpoint in directory %s (no `checkpoint` file and no "
                              "*.index); pass the checkpoint prefix, e.g. DIR/model.ckpt-3530000"
                              % path)
      latest = sorted(found)[-1][:-len(".index")]
    return latest
  if not tf.io.gfile.exists(path + ".index"):
    raise CheckpointError("checkpoint %s not found (no %s.index); pass a checkpoint prefix or the "
                          "directory holding it" % (path, path))
  return path


def restore_mismatches(stored, variables):
  """Graph variables a checkpoint cannot restore: [(name, stored shape or None, graph shape)].

  stored: {name: (shape, dtype)} as from `read_variables`; variables: tf Variables of a graph.
  """
  out = []
  for v in variables:
    name, shape = v.op.name, tuple(v.shape.as_list())
    if name not in stored:
      out.append((name, None, shape))
    elif tuple(stored[name][0]) != shape:
      out.append((name, tuple(stored[name][0]), shape))
  return out


def check_restorable(model_dir, variables, limit=8):
  """Raises CheckpointMismatchError when the latest checkpoint in `model_dir` (if any) cannot
  restore `variables`, e.g. a checkpoint written with another hparams set."""
  latest = tf.train.latest_checkpoint(model_dir) if model_dir else None
  if not latest:
    return
  bad = restore_mismatches(read_variables(latest), variables)
  if bad:
    shown = ["%s (checkpoint %s, model %s)" % (n, "missing" if s is None else list(s), list(g))
             for n, s, g in bad[:limit]]
    raise CheckpointMismatchError(
        "the checkpoint %s does not fit this model: %d variable(s) differ: %s%s. It was written "
        "with other hparams (or model); use the same --hparams_set/--hparams, or a new "
        "--output_dir." % (latest, len(bad), "; ".join(shown),
                           " ..." if len(bad) > limit else ""))


def read_variables(path):
  """{name: (shape tuple, dtype)} of a checkpoint (prefix or directory)."""
  return variables_of(tf.train.load_checkpoint(find_checkpoint(path)))


def variables_of(reader):
  """{name: (shape tuple, dtype)} of an open checkpoint reader."""
  shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
  return {name: (tuple(shapes[name]), dtypes[name]) for name in shapes}


def write_checkpoint(prefix, tensors):
  """Writes {name: numpy array} as a TF checkpoint at `prefix` (V2 format, tf.io.gfile paths)."""
  names = sorted(tensors)
  with tf.Graph().as_default():
    holders = [tf1.placeholder(tf.as_dtype(tensors[n].dtype), tensors[n].shape) for n in names]
    save = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                             shape_and_slices=[""] * len(names), tensors=holders)
    with tf1.Session() as sess:
      sess.run(save, {h: tensors[n] for h, n in zip(holders, names)})
