"""Restartable, atomic TFRecord shards with per-shard statistics.

A shard appears under its final name (`<name>-<split>-0000i-of-0000N`, the names T2T reads) only
once it is complete: it is written under `<data_dir>/<name>-incomplete/` and renamed at the end,
after its statistics (`<data_dir>/<name>-stats/<shard>.json`) are stored. An interrupted datagen
therefore leaves no file that training could mistake for data, and a re-run writes only the
shards that are missing; a finished split removes the empty `-incomplete` folder. Neither side
folder matches T2T's `<name>-<split>*` file pattern.
"""
import collections
import json
import os
import time

import numpy as np
import tensorflow.compat.v1 as tf

from tensor2tensor.data_generators import generator_utils

from problems.errors import DataError


def side_dir(data_dir, name, kind):
  """`<data_dir>/<name>-<kind>`: kind is "incomplete" or "stats"."""
  return os.path.join(data_dir, "%s-%s" % (name, kind))


def stats_path(shard_path, name):
  data_dir, base = os.path.split(shard_path)
  return os.path.join(side_dir(data_dir, name, "stats"), base + ".json")


def write_then_rename(path, write):
  """Calls `write(tmp)` for a temporary path beside `path`, then renames it to `path`: readers
  never see a half-written file."""
  tmp = "%s.tmp-%d" % (path, os.getpid())
  write(tmp)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def atomic_write(path, data, mode="w"):
  """Writes `data` to `path` through a temporary name and a rename."""

  def write(tmp):
    with tf.io.gfile.GFile(tmp, mode) as f:
      f.write(data)

  write_then_rename(path, write)


def read_stats(shard_path, name):
  """The stats dict datagen stored for a shard, or None when there is none."""
  stats_file = stats_path(shard_path, name)
  if not tf.io.gfile.exists(stats_file):
    return None
  with tf.io.gfile.GFile(stats_file) as f:
    return json.load(f)


def shard_complete(shard_path, name):
  return tf.io.gfile.exists(shard_path) and tf.io.gfile.exists(stats_path(shard_path, name))


class Progress(object):
  """Logs `<what>: shard i/N, units done/total, tokens, tokens/s` at most every `interval` s."""

  def __init__(self, what, total_units, unit_name, interval=10.0):
    self.what, self.total, self.unit_name, self.interval = what, total_units, unit_name, interval
    self.units = self.tokens = 0
    self.start = self.last = time.time()

  def update(self, units, tokens, shard, num_shards, force=False):
    self.units += units
    self.tokens += tokens
    now = time.time()
    if force or now - self.last >= self.interval:
      self.last = now
      rate = self.tokens / max(now - self.start, 1e-9)
      tf.logging.info("%s: shard %d/%d, %d/%d %s, %d tokens, %.0f tokens/s", self.what,
                      shard + 1, num_shards, self.units, self.total, self.unit_name,
                      self.tokens, rate)


def write_split(shard_paths, name, units, encode_unit, what, unit_name="units", shuffle=True):
  """Writes the examples of `units` into `shard_paths`, skipping shards already complete.

  Args:
    shard_paths: final TFRecord paths, one per shard.
    name: the problem's dataset_filename (names the side folders).
    units: list of work items (books, windows, images); shard i gets the i-th contiguous block.
    encode_unit: unit -> (list of feature dicts, stats dict of numbers, e.g. tokens, words).
    what: label for progress output, e.g. "pg19_length8k train".
    unit_name: what a unit is called in progress output ("books").
    shuffle: shuffle the examples inside each shard (seeded by the shard index).
  Returns:
    The summed stats of all shards of the split (also of the shards skipped).
  """
  data_dir = os.path.dirname(shard_paths[0])
  for kind in ("incomplete", "stats"):
    tf.io.gfile.makedirs(side_dir(data_dir, name, kind))
  blocks = np.array_split(np.arange(len(units)), len(shard_paths))
  progress = Progress(what, len(units), unit_name)
  for i, (path, block) in enumerate(zip(shard_paths, blocks)):
    if shard_complete(path, name):
      progress.update(len(block), 0, i, len(shard_paths))
      continue
    records, stats = [], collections.Counter(examples=0)
    for j in block:
      examples, unit_stats = encode_unit(units[j])
      records.extend(generator_utils.to_example(e).SerializeToString() for e in examples)
      stats.update(unit_stats)
      stats["examples"] += len(examples)
      stats["units"] += 1
      progress.update(1, unit_stats.get("tokens", 0), i, len(shard_paths))
    if shuffle:
      np.random.RandomState(i).shuffle(records)
    tmp = os.path.join(side_dir(data_dir, name, "incomplete"), os.path.basename(path))
    with tf.io.TFRecordWriter(tmp) as writer:
      for record in records:
        writer.write(record)
    stats["file_bytes"] = tf.io.gfile.stat(tmp).length
    atomic_write(stats_path(path, name), json.dumps(dict(stats), sort_keys=True))
    tf.io.gfile.rename(tmp, path, overwrite=True)
  progress.update(0, 0, len(shard_paths) - 1, len(shard_paths), force=True)
  remove_if_empty(side_dir(data_dir, name, "incomplete"))
  return split_stats(shard_paths, name)


def remove_if_empty(directory):
  """Removes `directory` when nothing is left in it (a split's shards all renamed out; the next
  split or an interrupted run's re-run makes it again)."""
  if tf.io.gfile.isdir(directory) and not tf.io.gfile.listdir(directory):
    tf.io.gfile.rmtree(directory)


def check_sizes(shard_paths, name):
  """Raises DataError naming a shard whose size differs from the size datagen wrote (a copy cut
  off at a record boundary reads as fewer records without any TF error). Shards without stored
  stats (records made elsewhere) are not checked."""
  for path in shard_paths:
    expected = (read_stats(path, name) or {}).get("file_bytes")
    actual = tf.io.gfile.stat(path).length
    if expected is not None and actual != expected:
      raise DataError(
          "shard %s is %d bytes but t2t-datagen wrote %d: it is truncated or was changed "
          "(an interrupted copy?). Copy it again, or delete it and %s and re-run t2t-datagen "
          "(it rewrites only the missing shards)." % (path, actual, expected,
                                                      stats_path(path, name)))


def split_stats(shard_paths, name):
  """Sum of the stored per-shard stats; raises DataError naming a shard without stats."""
  total = collections.Counter()
  for path in shard_paths:
    stats = read_stats(path, name)
    if stats is None:
      raise DataError("No statistics for shard %s (expected %s); re-run t2t-datagen."
                       % (path, stats_path(path, name)))
    total.update(stats)
  return dict(total)
