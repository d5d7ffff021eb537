"""Checkpoint files: find, list, write, and check that a graph can restore one.

Reads with `tf.train.load_checkpoint` (tf.io.gfile: local or gs:// paths). Knows nothing about the
model, so the model (restore check) and the converter (`checkpoints`) both import it.

Damaged checkpoints (`damage`): every tool finds its checkpoint with `find_checkpoint`, which
checks, from the index alone, that every data shard exists and holds the bytes the index expects;
training falls back to the newest complete one (`prepare_resume`).
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
  """A complete checkpoint prefix from a prefix or a directory (its latest checkpoint).

  Raises CheckpointError when there is none, DamagedCheckpointError (naming the damaged file and
  the newest complete checkpoint) when it is truncated, incomplete or unreadable."""
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
      found = tf.io.gfile.glob(os.path.join(path, "*.index"))
      if not found:
        raise CheckpointError("no checkpoint in directory %s (no `checkpoint` file and no "
                              "*.index); pass the checkpoint prefix, e.g. DIR/model.ckpt-3530000"
                              % path)
      latest = max((p[:-len(".index")] for p in found), key=checkpoint_step)
    return check_complete(latest)
  if not tf.io.gfile.exists(path + ".index"):
    raise CheckpointError("checkpoint %s not found (no %s.index); pass a checkpoint prefix or the "
                          "directory holding it" % (path, path))
  return check_complete(path)


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


# ---------------------------------------------------------------------------------------------
# Complete or damaged: checked from the index alone, before anything restores a checkpoint.


class DamagedCheckpointError(CheckpointError):
  """A checkpoint whose files are truncated, missing or unreadable; the message names the file
  and the newest complete checkpoint beside it."""
  one_line = True


_TABLE_MAGIC = 0xdb4775248b80fb57  # LevelDB/TF table footer magic number


def _varint(data, pos):
  """(value, next position) of the unsigned LEB128 varint at data[pos]."""
  value = shift = 0
  while True:
    if pos >= len(data):
      raise ValueError("varint runs past the end")
    byte = data[pos]
    pos += 1
    value |= (byte & 0x7f) << shift
    if not byte & 0x80:
      return value, pos
    shift += 7


def _handle(data, pos):
  """(offset, size, next position) of the BlockHandle at data[pos] (two varints)."""
  offset, pos = _varint(data, pos)
  size, pos = _varint(data, pos)
  return offset, size, pos


def _block(table, offset, size):
  """The contents of a table block. Blocks of a checkpoint index are stored uncompressed (a
  trailer of type byte 0 and a CRC)."""
  if offset + size + 5 > len(table):
    raise ValueError("a block lies beyond the end of the file")
  if table[offset + size] != 0:
    raise ValueError("compressed block (type %d)" % table[offset + size])
  return table[offset:offset + size]


def _block_entries(block):
  """Yields (key, value) of a table block (prefix-compressed keys, restart array at the end)."""
  restarts = int.from_bytes(block[-4:], "little")
  end = len(block) - 4 * (restarts + 1)
  pos, key = 0, b""
  while pos < end:
    shared, pos = _varint(block, pos)
    unshared, pos = _varint(block, pos)
    length, pos = _varint(block, pos)
    key = key[:shared] + block[pos:pos + unshared]
    pos += unshared
    yield key, block[pos:pos + length]
    pos += length
  if pos != end:
    raise ValueError("a block's entries overrun its restart array")


def read_index(prefix):
  """(BundleHeaderProto, {tensor key: BundleEntryProto}) of a V2 checkpoint's `.index` file.

  The index is a LevelDB-format table (footer -> index block -> data blocks); every entry holds a
  tensor's data shard, offset and size. Raises ValueError on a file that is not such a table.
  """
  from tensorflow.core.protobuf import tensor_bundle_pb2  # pylint: disable=g-import-not-at-top
  with tf.io.gfile.GFile(prefix + ".index", "rb") as f:
    table = f.read()
  if len(table) < 48 or int.from_bytes(table[-8:], "little") != _TABLE_MAGIC:
    raise ValueError("not a checkpoint index (%d bytes, no table footer)" % len(table))
  _, _, pos = _handle(table, len(table) - 48)  # the metaindex block (unused)
  offset, size, _ = _handle(table, pos)
  header, entries = None, {}
  for _, handle in _block_entries(_block(table, offset, size)):
    for key, value in _block_entries(_block(table, *_handle(handle, 0)[:2])):
      if key:
        entries[key.decode("utf-8", "replace")] = tensor_bundle_pb2.BundleEntryProto.FromString(
            value)
      else:
        header = tensor_bundle_pb2.BundleHeaderProto.FromString(value)
  if header is None:
    raise ValueError("the index has no header entry")
  return header, entries


def data_files(prefix, num_shards):
  return ["%s.data-%05d-of-%05d" % (prefix, i, num_shards) for i in range(num_shards)]


def expected_sizes(header, entries):
  """{shard id: bytes the data shard must hold} = the end of its last tensor."""
  sizes = {i: 0 for i in range(header.num_shards)}
  for entry in entries.values():
    if entry.size:
      if entry.shard_id not in sizes:
        raise ValueError("a tensor in data shard %d of %d" % (entry.shard_id, header.num_shards))
      sizes[entry.shard_id] = max(sizes[entry.shard_id], entry.offset + entry.size)
  return sizes


def damage(prefix):
  """None for a complete checkpoint, else one phrase naming the damaged file.

  Cheap: reads the index (kilobytes) and the sizes of the data shards, never the tensors. Finds a
  missing or unreadable index, a missing data shard and one that is shorter (a copy cut off) or
  longer than the index says; not a flipped byte inside a tensor (restore checks its CRC).
  """
  name = os.path.basename(prefix)
  if not tf.io.gfile.exists(prefix + ".index"):
    return "%s.index is missing" % name
  from google.protobuf import message  # pylint: disable=g-import-not-at-top
  try:
    header, entries = read_index(prefix)
  except (ValueError, IndexError, KeyError, message.DecodeError, tf.errors.OpError) as e:
    return "%s.index is unreadable (%s)" % (name, getattr(e, "message", e))
  try:
    sizes = expected_sizes(header, entries)
  except ValueError as e:
    return "%s.index is unreadable (%s)" % (name, e)
  for shard, path in enumerate(data_files(prefix, header.num_shards)):
    if not tf.io.gfile.exists(path):
      return "%s is missing" % os.path.basename(path)
    actual = tf.io.gfile.stat(path).length
    if actual != sizes[shard]:
      return "%s is %d bytes but its index expects %d (%s)" % (
          os.path.basename(path), actual, sizes[shard],
          "truncated: an interrupted write or copy" if actual < sizes[shard] else "changed")
  return None


def checkpoint_step(prefix):
  """The step number of `.../model.ckpt-N` (-1 when the name has none)."""
  tail = prefix.rsplit("-", 1)[-1]
  return int(tail) if tail.isdigit() else -1


def _checkpoint_state(model_dir):
  try:
    return tf1.train.get_checkpoint_state(model_dir)
  except (ValueError, tf.errors.OpError):  # an unreadable `checkpoint` file
    return None


def resume_checkpoint(model_dir):
  """(the checkpoint a run restores: the one the `checkpoint` state file names when complete,
  else the newest complete one before it, or None; [(damaged prefix, phrase)] passed over).

  Without a readable state file every `*.index` in the folder is a candidate.
  """
  state = _checkpoint_state(model_dir)
  found = {p[:-len(".index")] for p in tf.io.gfile.glob(os.path.join(model_dir, "*.index"))}
  named = state.model_checkpoint_path if state and state.model_checkpoint_path else None
  if state:
    found.update(state.all_model_checkpoint_paths)
  ordered = sorted(found, key=checkpoint_step, reverse=True)
  if named:
    ordered = [named] + [p for p in ordered
                         if p != named and checkpoint_step(p) < checkpoint_step(named)]
  damaged = []
  for prefix in ordered:
    why = damage(prefix)
    if why is None:
      return prefix, damaged
    damaged.append((prefix, why))
  return None, damaged


def checkpoint_bytes(prefix):
  """Bytes of a checkpoint's files (index and data shards)."""
  return sum(tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(prefix + ".*"))


def newest_complete(folder, exclude=None):
  """The complete checkpoint in `folder` with the highest step (other than `exclude`), or None."""
  found = {p[:-len(".index")] for p in tf.io.gfile.glob(os.path.join(folder, "*.index"))}
  state = _checkpoint_state(folder)
  if state:
    found.update(state.all_model_checkpoint_paths)
  for prefix in sorted(found - {exclude}, key=checkpoint_step, reverse=True):
    if damage(prefix) is None:
      return prefix
  return None


def damaged_message(prefix, why, good):
  """One line for a read-only tool: the damaged file and the newest good checkpoint."""
  advice = ("The newest complete checkpoint is %s: pass it instead, or copy the damaged files "
            "again." % good if good else "No complete checkpoint is beside it; copy the files "
            "again.")
  return "checkpoint %s is damaged: %s. %s" % (prefix, why, advice)


def check_complete(prefix):
  """`prefix` when complete; else raises DamagedCheckpointError naming the damaged file and the
  newest complete checkpoint in its folder (see `damage`). Every tool that restores calls it."""
  why = damage(prefix)
  if why is None:
    return prefix
  raise DamagedCheckpointError(damaged_message(
      prefix, why, newest_complete(os.path.dirname(prefix) or ".", exclude=prefix)))


DAMAGED_DIR = "damaged"


def prepare_resume(model_dir):
  """Makes a training run in `model_dir` restore the newest complete checkpoint.

  When the checkpoint the `checkpoint` state file names is damaged (or the state file is missing
  or unreadable while checkpoints exist), the damaged checkpoints newer than the newest complete
  one are moved, never deleted, to `<model_dir>/damaged/` (so a save at their step cannot
  overwrite them) and the state file is rewritten to name the complete one.
  Returns a one-line warning, or None when nothing had to change. Raises DamagedCheckpointError
  when checkpoints exist but none is complete (starting from scratch would be a silent loss).
  """
  if not model_dir or not tf.io.gfile.isdir(model_dir):
    return None
  state = _checkpoint_state(model_dir)
  named = state.model_checkpoint_path if state and state.model_checkpoint_path else None
  good, damaged = resume_checkpoint(model_dir)
  if good is None and not damaged:
    return None  # a new run
  if good is None:
    prefix, why = damaged[0]
    raise DamagedCheckpointError(
        "no complete checkpoint in %s: %s is damaged: %s. Copy the files again (or move them "
        "away to start from scratch)." % (model_dir, prefix, why))
  if good == named:
    return None
  moved = []
  for prefix, _ in damaged:
    if checkpoint_step(prefix) > checkpoint_step(good):
      moved.append(prefix)
      target = os.path.join(model_dir, DAMAGED_DIR)
      tf.io.gfile.makedirs(target)
      for path in tf.io.gfile.glob(prefix + ".*"):
        tf.io.gfile.rename(path, os.path.join(target, os.path.basename(path)), overwrite=True)
  kept = [p for p in (state.all_model_checkpoint_paths if state else [good])
          if checkpoint_step(p) <= checkpoint_step(good) and p not in dict(damaged)]
  tf1.train.update_checkpoint_state(model_dir, good, all_model_checkpoint_paths=kept or [good])
  if damaged:
    prefix, why = damaged[0]
    skipped = "checkpoint %s is damaged (%s)" % (os.path.basename(prefix), why)
  else:
    skipped = "the `checkpoint` state file in %s is missing or unreadable" % model_dir
  where = (" (kept in %s)" % os.path.join(model_dir, DAMAGED_DIR)) if moved else ""
  return "warning: %s%s; resuming from %s, the newest complete checkpoint." % (
      skipped, where, good)
