"""CIFAR-10 and ImageNet 64x64 as raster-scan RGB byte sequences (unconditional generation).

An image [side, side, 3] becomes side*side*3 ids in raster order (row by row, pixel by pixel,
R G B), each id = value + 2 (0 padding and 1 EOS stay reserved, as in T2T's ByteTextEncoder), so
258 ids. Records store the pixels as raw bytes (`pixels`, 1 byte per dimension) and the reader
turns them into `targets`. Evaluation reports bits per dimension.

* `cifar10_pixels` (3072 ids): the python batches `cifar-10-batches-py/{data_batch_1..5,
  test_batch}` (T2T's file names), or `cifar-10-python.tar.gz`, in --tmp_dir or `CIFAR10_DIR`;
  train = the 50,000 training images, dev = test = the 10,000 test images.
* `imagenet64_pixels` (12288 ids): the downsampled ImageNet npz files of Chrabaszcz et al.
  (2017), `train_data_batch_{1..10}.npz` and `val_data.npz` (key `data`, [n, 12288] uint8,
  channel-planar), in --tmp_dir (or its subfolders Imagenet64_train_npz/, Imagenet64_val_npz/)
  or `IMAGENET64_DIR`; dev = test = the 50,000 validation images.
"""
import io
import os
import pickle
import tarfile
import zipfile

import numpy as np
import tensorflow.compat.v1 as tf

from tensor2tensor.data_generators import cifar
from tensor2tensor.data_generators import text_encoder
from tensor2tensor.utils import registry

from problems import lm
from problems.errors import DataError
from routing_transformer.t2t import perplexity

NUM_RESERVED = text_encoder.NUM_RESERVED_TOKENS
BLOCK = 1000  # images per unit of work


def check_planar_shape(shape, side):
  """Raises DataError unless `shape` is [n, 3*side*side]."""
  if len(shape) != 2 or shape[1] != 3 * side * side:
    raise DataError("expected images as uint8 [n, %d] (3 planes of %dx%d), got shape %s"
                    % (3 * side * side, side, side, tuple(shape)))


def raster(planar, side):
  """Channel-planar uint8 [n, 3*side*side] (R plane, G plane, B plane) -> raster [n, side*side*3]."""
  planar = np.asarray(planar, dtype=np.uint8)
  check_planar_shape(planar.shape, side)
  return planar.reshape(-1, 3, side, side).transpose(0, 2, 3, 1).reshape(planar.shape[0], -1)


def pixel_ids(pixels):
  """uint8 pixels [..., d] -> int64 ids (value + 2)."""
  return tf.cast(pixels, tf.int64) + NUM_RESERVED


class ImagePixels(lm.ByteVocabulary, lm.LanguageModelProblem):
  """Images as id sequences; subclasses list their files and read one into planar arrays."""

  side = 32
  unit_name = "images"
  how_to_get = ""
  env_var = ""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._cache = (None, None)

  @property
  def length(self):
    return self.side * self.side * 3

  def example_reading_spec(self):
    return {"pixels": tf.FixedLenFeature([], tf.string)}, None

  def preprocess_example(self, example, mode, hparams):
    del mode, hparams
    pixels = tf.io.decode_raw(example.pop("pixels"), tf.uint8)
    example["targets"] = tf.reshape(pixel_ids(pixels), [self.length])
    return example

  def root(self, tmp_dir):
    return os.environ.get(self.env_var) or tmp_dir

  def files(self, split, tmp_dir):
    """[(file key, number of images)] of `split`."""
    raise NotImplementedError

  def load(self, key):
    """Channel-planar uint8 [n, 3*side*side] of one file."""
    raise NotImplementedError

  def images(self, key):
    if self._cache[0] != key:
      self._cache = (key, raster(self.load(key), self.side))
    return self._cache[1]

  def split_units(self, split, tmp_dir, encoder):
    del encoder
    return [(key, start, min(start + BLOCK, n)) for key, n in self.files(split, tmp_dir)
            for start in range(0, n, BLOCK)]

  def encode_unit(self, unit, encoder):
    del encoder
    key, start, end = unit
    block = self.images(key)[start:end]
    return ([{"pixels": [row.tobytes()]} for row in block],
            {"tokens": block.size, "images": len(block)})

  def report(self, total_nll, num_tokens, stats):
    out = perplexity.summary(total_nll, num_tokens)
    out["bits_per_dim"] = perplexity.bits_per_unit(total_nll, num_tokens, "dimension")
    return out


CIFAR_FOLDER = cifar._CIFAR10_PREFIX.rstrip("/")  # pylint: disable=protected-access
CIFAR_TAR = "cifar-10-python.tar.gz"
CIFAR_FILES = {"train": cifar._CIFAR10_TRAIN_FILES,  # pylint: disable=protected-access
               "dev": cifar._CIFAR10_TEST_FILES,  # pylint: disable=protected-access
               "test": cifar._CIFAR10_TEST_FILES}  # pylint: disable=protected-access


def unpickle_cifar(data, where):
  """Planar uint8 [n, 3072] of one CIFAR python batch (bytes of the pickle)."""
  try:
    batch = pickle.loads(data, encoding="bytes")
    return np.asarray(batch[b"data"], dtype=np.uint8)
  except Exception as e:  # pylint: disable=broad-except
    raise DataError("CIFAR-10: %s is not a CIFAR python batch (%s: %s). %s"
                    % (where, type(e).__name__, e, Cifar10Pixels.how_to_get))


@registry.register_problem
class Cifar10Pixels(ImagePixels):
  """CIFAR-10, 3072 ids per image (T2T name: cifar10_pixels)."""

  side = 32
  num_shards = {"train": 10, "dev": 1, "test": 1}
  env_var = "CIFAR10_DIR"
  how_to_get = ("Get cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html "
                "and put it (or its cifar-10-batches-py/ folder) in --tmp_dir or CIFAR10_DIR.")

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._tar, self._members = None, None  # the tar.gz read (once for all splits), its members

  def files(self, split, tmp_dir):
    root = self.root(tmp_dir)
    folder = os.path.join(root or "", CIFAR_FOLDER)
    tar = os.path.join(root or "", CIFAR_TAR)
    if tf.io.gfile.isdir(folder):
      self._tar, self._members = None, None
      keys = [os.path.join(folder, f) for f in CIFAR_FILES[split]]
      missing = [k for k in keys if not tf.io.gfile.exists(k)]
      if missing:
        raise DataError("CIFAR-10: %s is missing. %s" % (missing[0], self.how_to_get))
    elif tf.io.gfile.exists(tar):
      if self._tar != tar:
        self._tar, self._members = tar, self._read_tar(tar)
      keys = [CIFAR_FOLDER + "/" + f for f in CIFAR_FILES[split]]
      missing = [k for k in keys if k not in self._members]
      if missing:
        raise DataError("CIFAR-10: %s has no member %s. %s" % (tar, missing[0], self.how_to_get))
    else:
      raise DataError("CIFAR-10: neither %s/ nor %s found. %s" % (folder, tar, self.how_to_get))
    return [(k, len(self.images(k))) for k in keys]

  def _read_tar(self, tar):
    with tf.io.gfile.GFile(tar, "rb") as f:
      data = f.read()
    try:
      with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
    except (tarfile.TarError, OSError) as e:
      raise DataError("CIFAR-10: %s is not a readable tar.gz (%s). %s"
                      % (tar, e, self.how_to_get))

  def load(self, key):
    if self._members is not None:
      return unpickle_cifar(self._members[key], key)
    with tf.io.gfile.GFile(key, "rb") as f:
      return unpickle_cifar(f.read(), key)


IMAGENET_FILES = {"train": ["train_data_batch_%d.npz" % i for i in range(1, 11)],
                  "dev": ["val_data.npz"], "test": ["val_data.npz"]}


@registry.register_problem
class Imagenet64Pixels(ImagePixels):
  """Downsampled ImageNet 64x64, 12288 ids per image (T2T name: imagenet64_pixels)."""

  side = 64
  num_shards = {"train": 100, "dev": 2, "test": 2}
  env_var = "IMAGENET64_DIR"
  how_to_get = ("Get Imagenet64_train_npz.zip and Imagenet64_val_npz.zip from "
                "https://image-net.org/download-images (Downsampled ImageNet 64x64), unzip them "
                "into --tmp_dir or IMAGENET64_DIR: train_data_batch_1..10.npz, val_data.npz.")

  def files(self, split, tmp_dir):
    root = self.root(tmp_dir) or ""
    folders = [root, os.path.join(root, "Imagenet64_train_npz"),
               os.path.join(root, "Imagenet64_val_npz")]
    keys = []
    for name in IMAGENET_FILES[split]:
      found = [os.path.join(d, name) for d in folders
               if tf.io.gfile.exists(os.path.join(d, name))]
      if not found:
        raise DataError("ImageNet64: %s not found in %s. %s"
                        % (name, " or ".join(folders), self.how_to_get))
      keys.append(found[0])
    return [(k, self.num_images(k)) for k in keys]

  def num_images(self, key):
    """Rows of the file's `data` array, from the .npy header only (the 1.5 GB training files are
    then read once, when their images are encoded)."""
    try:
      with tf.io.gfile.GFile(key, "rb") as f, zipfile.ZipFile(f) as z, z.open("data.npy") as m:
        version = np.lib.format.read_magic(m)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape = read_header(m)[0]
    except Exception as e:  # pylint: disable=broad-except
      raise self.format_error(key, e)
    check_planar_shape(shape, self.side)
    return shape[0]

  def load(self, key):
    with tf.io.gfile.GFile(key, "rb") as f:
      try:
        with np.load(io.BytesIO(f.read())) as npz:
          return npz["data"]
      except Exception as e:  # pylint: disable=broad-except
        raise self.format_error(key, e)

  def format_error(self, key, error):
    return DataError("ImageNet64: %s is not an npz with a 'data' array (%s: %s). %s"
                     % (key, type(error).__name__, error, self.how_to_get))
