"""Miniature datasets in the official layouts, generated for the problem tests."""
import io
import os
import pickle
import tarfile
import zipfile

import numpy as np

WORDS = ("the routing transformer attends to clusters of queries and keys chosen by online "
         "k-means over a long book , while local attention sees a window . café naïve — "
         "«quoted» 1984 Dr. Watson's").split()


def sentence_text(rng, num_words):
  words = rng.choice(WORDS, size=num_words)
  lines, line = [], []
  for i, w in enumerate(words):
    line.append(str(w))
    if i % 17 == 16:
      lines.append(" ".join(line))
      line = []
  lines.append(" ".join(line))
  return "\n".join(lines)


PG19_BOOKS = {"train": {101: 9000, 102: 500, 103: 1200},
              "validation": {201: 800, 202: 300},
              "test": {301: 400, 302: 700}}


def make_pg19(root, seed=0, books=None):
  """Official PG-19 layout under root; returns {split folder: {book_id: text}}."""
  rng = np.random.default_rng(seed)
  books = books or PG19_BOOKS
  texts = {}
  rows = []
  for split, sizes in books.items():
    os.makedirs(os.path.join(root, split), exist_ok=True)
    texts[split] = {}
    for book_id, num_words in sizes.items():
      text = sentence_text(rng, num_words)
      texts[split][book_id] = text
      with open(os.path.join(root, split, "%d.txt" % book_id), "w", encoding="utf-8") as f:
        f.write(text + "\n")
      rows.append('%d,"Book %d, a title with a comma",1900,http://www.gutenberg.org/ebooks/%d'
                  % (book_id, book_id, book_id))
  with open(os.path.join(root, "metadata.csv"), "w") as f:
    f.write("\n".join(rows) + "\n")
  return texts


def make_enwik8(folder, size=200000, seed=0, as_zip=True):
  """A miniature enwik8 (every byte value occurs); returns its bytes."""
  rng = np.random.default_rng(seed)
  text = ("<page><title>Routing</title><text>" + sentence_text(rng, size // 6) + "</text></page>")
  data = (text.encode("utf-8") + bytes(range(256)) * 4)
  data = (data * (size // len(data) + 1))[:size]
  os.makedirs(folder, exist_ok=True)
  if as_zip:
    with zipfile.ZipFile(os.path.join(folder, "enwik8.zip"), "w", zipfile.ZIP_DEFLATED) as z:
      z.writestr("enwik8", data)
  else:
    with open(os.path.join(folder, "enwik8"), "wb") as f:
      f.write(data)
  return data


def make_wikitext103(folder, seed=0):
  """wikitext-103/wiki.{train,valid,test}.tokens; returns {split: list of lines}."""
  rng = np.random.default_rng(seed)
  root = os.path.join(folder, "wikitext-103")
  os.makedirs(root, exist_ok=True)
  out = {}
  for split, n in (("train", 300), ("valid", 40), ("test", 50)):
    lines = []
    for i in range(n):
      if i % 10 == 0:
        lines.append(" = Heading %d = " % i)
      elif i % 10 == 1:
        lines.append("")
      else:
        lines.append(" " + " ".join(str(w) for w in rng.choice(WORDS, size=12)) + " <unk> @-@ ")
    if split == "valid":
      lines.append(" a zyzzyva never seen in training ")
    out[split] = lines
    with open(os.path.join(root, "wiki.%s.tokens" % split), "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
  return out


def planar_images(rng, n, side):
  return rng.integers(0, 256, size=(n, 3 * side * side), dtype=np.uint8)


def make_cifar10(folder, per_batch=12, seed=0, as_tar=True):
  """cifar-10-batches-py python batches (or the tar.gz); returns {file: planar [n, 3072]}."""
  rng = np.random.default_rng(seed)
  batches = {}
  for name in ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch"]:
    data = planar_images(rng, per_batch, 32)
    batches[name] = data
  payload = {name: pickle.dumps({b"data": d, b"labels": [0] * len(d)})
             for name, d in batches.items()}
  os.makedirs(folder, exist_ok=True)
  if as_tar:
    with tarfile.open(os.path.join(folder, "cifar-10-python.tar.gz"), "w:gz") as t:
      for name, blob in payload.items():
        info = tarfile.TarInfo("cifar-10-batches-py/" + name)
        info.size = len(blob)
        t.addfile(info, io.BytesIO(blob))
  else:
    os.makedirs(os.path.join(folder, "cifar-10-batches-py"), exist_ok=True)
    for name, blob in payload.items():
      with open(os.path.join(folder, "cifar-10-batches-py", name), "wb") as f:
        f.write(blob)
  return batches


def make_imagenet64(folder, per_batch=2, num_val=3, seed=0):
  """Imagenet64_{train,val}_npz/*.npz; returns {file name: planar [n, 12288]}."""
  rng = np.random.default_rng(seed)
  out = {}
  for sub, names in (("Imagenet64_train_npz", ["train_data_batch_%d.npz" % i
                                               for i in range(1, 11)]),
                     ("Imagenet64_val_npz", ["val_data.npz"])):
    os.makedirs(os.path.join(folder, sub), exist_ok=True)
    for name in names:
      data = planar_images(rng, num_val if name == "val_data.npz" else per_batch, 64)
      np.savez(os.path.join(folder, sub, name), data=data, labels=np.ones(len(data)),
               mean=np.zeros(12288))
      out[name] = data
  return out


def raster(planar, side):
  """Independent re-statement: pixel (r, c) channel ch of planar row x is
  x[ch * side * side + r * side + c]."""
  n = planar.shape[0]
  out = np.zeros((n, side, side, 3), np.uint8)
  for ch in range(3):
    out[..., ch] = planar[:, ch * side * side:(ch + 1) * side * side].reshape(n, side, side)
  return out.reshape(n, -1)
