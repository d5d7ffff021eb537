"""What routing learns: attention patterns (paper Figure 1), cluster occupancy, and the
Jensen-Shannon divergence between heads (paper Table 6) of a trained checkpoint.

    python -m routing_transformer.tools.analysis --checkpoint_dir RUN [--problem P] [--data_dir D]
        [--hparams_set S] [--num_sequences 4] [--output_dir RUN/analysis] [--t2t_usr_dir D,...]

`--problem`, `--data_dir` and `--hparams_set` default to the values t2t-trainer recorded in
RUN/flags_t2t.txt; hparams.json in RUN is applied as t2t-trainer does; `--t2t_usr_dir` registers
a user's own problems and hparams sets. Writes into output_dir:
  attention_patterns.png  the top routing layer on the first sequence: a local head's attention
                          weights, a routing head's support (colour = cluster) and its weights
                          (log colour scale); the layer's head focus in the title
  cluster_occupancy.png   per routing layer and head, the share of positions whose nearest
                          centroid is each cluster (dashed: uniform 1/c)
  head_js.png, head_js.md per layer, the mean JS divergence (nats, at most ln 2 = 0.6931) between
                          local-local, local-routing and routing-routing head pairs
  head_focus.md           per layer and head kind: mean attention weight on the query's own
                          position, mean max weight, mean number of keys above 1%, share of
                          queries attending nowhere (in no routing cluster)
  analysis.json           the numbers behind the pictures

How the dense attention of a head is obtained: the model is built in EVAL mode while every call of
the pure attention functions is recorded; each recorded call is repeated with identity values
(v = I_n, relative values off), so the output row i is exactly that head's attention
distribution over inputs j (routing outputs are divided by the cluster count + 0.01 and are
renormalised here; queries in no cluster have no distribution and are left out).
"""
import argparse
import contextlib
import json
import os

import numpy as np

from routing_transformer.tools import curves
from routing_transformer.t2t import perplexity

LN2 = perplexity.LN2
PAIR_KINDS = ("local-local", "local-routing", "routing-routing")


def js_divergence(p, q):
  """Jensen-Shannon divergence in nats along the last axis: [..., n], [..., n] -> [...].

  0.5 KL(p || m) + 0.5 KL(q || m) with m = (p + q) / 2; 0 log 0 = 0; at most ln 2.
  """
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  m = 0.5 * (p + q)

  def kl(a):
    ratio = np.where(a > 0, a / np.where(m > 0, m, 1.0), 1.0)
    return np.sum(np.where(a > 0, a * np.log(ratio), 0.0), axis=-1)
  return 0.5 * kl(p) + 0.5 * kl(q)


def normalise_rows(probs):
  """Rows [..., n, n] scaled to sum 1; returns (probs, valid [..., n]) with empty rows invalid."""
  total = probs.sum(axis=-1, keepdims=True)
  valid = total[..., 0] > 1e-6
  return np.where(total > 1e-6, probs / np.maximum(total, 1e-30), 0.0), valid


def head_pair_js(probs, valid, kinds):
  """Mean JS divergence per kind of head pair in one layer.

  Args:
    probs: [b, h, n, n] attention distributions (rows sum to 1 where valid).
    valid: bool [b, h, n] rows that have a distribution (real, attended queries).
    kinds: list of h strings, "local" or "routing".
  Returns:
    dict pair kind -> {"mean": mean over pairs of the row-averaged JS, "pairs": count}, only for
    kinds that have at least one pair.
  """
  per_kind = {}
  for a in range(len(kinds)):
    for b in range(a + 1, len(kinds)):
      kind = "-".join(sorted((kinds[a], kinds[b])))
      both = valid[:, a] & valid[:, b]
      if not both.any():
        continue
      js = js_divergence(probs[:, a], probs[:, b])
      per_kind.setdefault(kind, []).append(float(js[both].mean()))
  return {k: {"mean": float(np.mean(v)), "pairs": len(v)} for k, v in per_kind.items()}


FOCUS_KEYS = ("self", "max", "keys_above_1pct", "unattended")


def head_focus(probs, valid, kinds, real=None, threshold=0.01):
  """Where the heads of each kind put their attention, averaged over query rows.

  Rows of position 0 are left out (a causal query there can only attend to itself).

  Args:
    probs: [b, h, n, n] attention distributions (rows sum to 1 where valid).
    valid: bool [b, h, n] rows that have a distribution.
    kinds: list of h strings, "local" or "routing".
    real: optional bool [b, n], False at padding (default: every position).
    threshold: weight above which a key counts as attended.
  Returns:
    {kind: {"self": mean weight on the query's own position, "max": mean largest weight,
    "keys_above_1pct": mean number of keys with weight > threshold (these three over rows with
    a distribution), "unattended": share of real rows without one (a paper-routing query that
    no cluster took gets 0 from the routing heads), "rows": rows averaged}}.
  """
  b, h, n = valid.shape
  real = np.ones([b, n], bool) if real is None else real
  real = np.broadcast_to(real[:, None, :], [b, h, n]).copy()
  real[:, :, 0] = False
  valid = valid & real
  diagonal = probs[..., np.arange(n), np.arange(n)]  # [b, h, n]
  out = {}
  for kind in sorted(set(kinds)):
    heads = [i for i, k in enumerate(kinds) if k == kind]
    rows = valid[:, heads]
    if not real[:, heads].any():
      continue
    part = probs[:, heads]
    out[kind] = {"self": float(diagonal[:, heads][rows].mean()) if rows.any() else 0.0,
                 "max": float(part.max(axis=-1)[rows].mean()) if rows.any() else 0.0,
                 "keys_above_1pct": float((part > threshold).sum(axis=-1)[rows].mean())
                                    if rows.any() else 0.0,
                 "unattended": float(1.0 - rows.sum() / real[:, heads].sum()),
                 "rows": int(rows.sum())}
  return out


def focus_table(ids, records):
  """{layer: head_focus(...)} with padding queries left out."""
  table = {}
  for layer, (probs, kinds, _) in layer_heads(records).items():
    probs, valid = normalise_rows(probs)
    table[layer] = head_focus(probs, valid, kinds, ids != 0)
  return table


def focus_markdown(table):
  lines = ["| layer | heads | weight on own position | max weight | keys above 1% | queries "
           "attending nowhere |", "|---|---|---|---|---|---|"]
  for layer, row in table.items():
    for kind, f in row.items():
      lines.append("| %d | %s | %.3f | %.3f | %.1f | %.1f%% |" % (
          layer, kind, f["self"], f["max"], f["keys_above_1pct"], 100 * f["unattended"]))
  return "\n".join(lines) + (
      "\n\nPer layer and head kind, over the query rows past position 0 of the eval sequences: "
      "the mean attention weight on the query's own position, the mean largest weight, the mean "
      "number of keys holding more than 1% (over queries that attend somewhere), and the share "
      "of queries that attend nowhere (paper routing: in no cluster, so the routing heads "
      "give them 0).\n")


def occupancy_shares(clusters, num_clusters, real):
  """Share of real positions whose nearest centroid is each cluster.

  Args:
    clusters: int [b, h, n] nearest-centroid assignments.
    num_clusters: c.
    real: bool [b, n], False at padding.
  Returns:
    [h, c] shares (rows sum to 1).
  """
  heads = clusters.shape[1]
  shares = np.zeros([heads, num_clusters])
  for h in range(heads):
    counts = np.bincount(clusters[:, h][real], minlength=num_clusters)
    shares[h] = counts / max(counts.sum(), 1)
  return shares


def cluster_colours(record, n, sequence=0, head=0):
  """Cluster id of every (output i, input j) a routing head lets i attend to (-1 elsewhere).

  Paper routing: every centroid's members attend to each other (j <= i when causal), so the
  colour is that cluster; causal_window routing: the query's own cluster.
  """
  colours = -np.ones([n, n], np.int64)
  attended = record["probs"][sequence, head] > 0
  if "query_indices" in record:
    for c, members in enumerate(record["query_indices"][sequence, head]):
      block = colours[np.ix_(members, members)]
      colours[np.ix_(members, members)] = np.where(attended[np.ix_(members, members)], c, block)
  else:
    colours = np.where(attended, record["query_clusters"][sequence, head][:, None], -1)
  return colours


# ---------------------------------------------------------------------------------------------
# Recording the model's attention (TF graph side)


@contextlib.contextmanager
def recording_attention(records):
  """Records, for every self-attention layer the model builds, the dense attention of its heads.

  Observes the heads' calls of the pure attention functions (`heads.observing`); appends to
  `records` one dict per attention call of a layer:
    layer (int), kind ("local" | "routing"), probs [b, h, n, n] tensor (unnormalised for paper
    routing: divided by cluster count + 0.01), values and output [b, h, n, d] of the real call,
    and for routing query_clusters [b, h, n], query_indices [b, h, c, w] (paper routing only),
    centroids [h, c, d].
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import attention  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import heads  # pylint: disable=g-import-not-at-top

  def identity_values(v):
    n = v.shape[2]
    return tf.broadcast_to(tf.eye(n, dtype=v.dtype), tf.concat([tf.shape(v)[:2], [n, n]], 0))

  def observe(function, args, kwargs, result, layer):
    if layer is None:
      return
    q, k, v = args[:3]
    dense_kwargs = dict(kwargs, relative_values=None)
    if function is attention.local_attention:
      probs = function(q, k, identity_values(v), *args[3:], **dense_kwargs)
      records.append(dict(layer=layer, kind="local", probs=probs, values=v, output=result))
      return
    probs, aux = function(q, k, identity_values(v), *args[3:], **dense_kwargs)
    record = dict(layer=layer, kind="routing", probs=probs, query_clusters=aux["query_clusters"],
                  centroids=tf.convert_to_tensor(args[3]), values=v, output=result[0])
    if "query_indices" in aux:
      record["query_indices"] = aux["query_indices"]
    records.append(record)

  with heads.observing(observe):
    yield records


def run_flags(checkpoint_dir):
  """--name=value pairs t2t-trainer recorded in checkpoint_dir/flags_t2t.txt (or flags.txt)."""
  flags = {}
  for name in ("flags_t2t.txt", "flags.txt"):
    path = os.path.join(checkpoint_dir, name)
    if os.path.exists(path):
      with open(path) as f:
        for line in f:
          if line.startswith("--") and "=" in line:
            key, value = line[2:].rstrip("\n").split("=", 1)
            flags.setdefault(key, value)
  return flags


def eval_sequences(problem, hparams, data_dir, num):
  """The first `num` eval targets, zero-padded to the model length: int [num, n]."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  length = hparams.max_target_length or hparams.max_length
  dataset = problem.dataset(tf.estimator.ModeKeys.EVAL, data_dir=data_dir, shuffle_files=False)
  rows = []
  for example in dataset.take(num):
    ids = example["targets"].numpy().reshape(-1)[:length]
    rows.append(np.pad(ids, [0, length - len(ids)]))
  if not rows:
    raise SystemExit("analysis: no eval examples for problem %s in %s; run t2t-datagen first."
                     % (problem.name, data_dir))
  return np.stack(rows).astype(np.int32)


def collect(checkpoint_dir, problem=None, data_dir=None, hparams_set=None, num_sequences=4,
            t2t_usr_dir=None):
  """Runs the checkpoint on eval sequences and returns (ids [b, n], records as numpy dicts).

  t2t_usr_dir: comma-separated user directories whose problems/hparams sets to register."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from routing_transformer.t2t import usr_dirs  # pylint: disable=g-import-not-at-top
  try:
    usr_dirs.import_usr_dirs(t2t_usr_dir)
  except usr_dirs.UsrDirError as e:
    raise SystemExit("analysis: %s" % e)
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  tf.get_logger().setLevel("ERROR")
  tf1 = tf.compat.v1
  from routing_transformer.tools import checkpoints  # pylint: disable=g-import-not-at-top
  try:
    checkpoint = checkpoints.find_checkpoint(checkpoint_dir)
  except checkpoints.CheckpointError as e:
    raise SystemExit("analysis: %s" % e)
  flags = run_flags(checkpoint_dir)
  problem = problem or flags.get("problem")
  data_dir = os.path.expanduser(data_dir or flags.get("data_dir", ""))
  hparams_set = hparams_set or flags.get("hparams_set")
  if not (problem and hparams_set and data_dir):
    raise SystemExit("analysis: pass --problem, --hparams_set and --data_dir (%s has no "
                     "flags_t2t.txt to take them from)." % checkpoint_dir)
  hparams = trainer_lib.create_hparams(
      hparams_set, data_dir=data_dir, problem_name=problem,
      hparams_path=os.path.join(checkpoint_dir, "hparams.json"))
  ids = eval_sequences(registry.problem(problem), hparams, data_dir, num_sequences)
  records = []
  with tf.Graph().as_default(), recording_attention(records):
    targets = tf1.placeholder(tf.int32, [len(ids), ids.shape[1], 1, 1])
    model = registry.model("routing_transformer")(hparams, tf.estimator.ModeKeys.EVAL)
    model({"targets": targets})
    with tf1.Session() as sess:
      tf1.train.Saver().restore(sess, checkpoint)
      tensors = [{k: v for k, v in r.items() if tf.is_tensor(v)} for r in records]
      fetched = sess.run(tensors, {targets: ids[:, :, None, None]})
  return ids, [dict(record, **values) for record, values in zip(records, fetched)]


# ---------------------------------------------------------------------------------------------
# Tables and pictures


def layer_heads(records):
  """Groups records by layer: {layer: (probs [b, h, n, n], kinds, routing record or None)}."""
  grouped = {}
  for record in records:
    grouped.setdefault(record["layer"], []).append(record)
  layers = {}
  for layer, parts in sorted(grouped.items()):
    probs = np.concatenate([p["probs"] for p in parts], axis=1)
    kinds = [p["kind"] for p in parts for _ in range(p["probs"].shape[1])]
    routing = next((p for p in parts if p["kind"] == "routing"), None)
    layers[layer] = (probs, kinds, routing)
  return layers


def js_table(ids, records):
  """{layer: head_pair_js(...)} with padding queries left out."""
  real = ids != 0
  table = {}
  for layer, (probs, kinds, _) in layer_heads(records).items():
    probs, valid = normalise_rows(probs)
    valid &= real[:, None, :]
    table[layer] = head_pair_js(probs, valid, kinds)
  return table


def js_markdown(table):
  lines = ["| layer | " + " | ".join(PAIR_KINDS) + " |", "|---" * (len(PAIR_KINDS) + 1) + "|"]
  for layer, row in table.items():
    cells = ["%.4f (%d)" % (row[k]["mean"], row[k]["pairs"]) if k in row else "-"
             for k in PAIR_KINDS]
    lines.append("| %d | %s |" % (layer, " | ".join(cells)))
  return "\n".join(lines) + (
      "\n\nMean Jensen-Shannon divergence (nats; upper bound ln 2 = %.4f) between the attention "
      "distributions of two heads of the same layer, averaged over query rows and eval sequences; "
      "in parentheses the number of head pairs.\n" % LN2)


def focus_title(focus):
  """The head-focus numbers of one layer in a line: `routing heads: 37% of the weight on the query
  itself, 12% of queries in no cluster; local heads: 21% on itself`."""
  parts = []
  for kind in ("routing", "local"):
    if kind in focus:
      text = "%s heads: %.0f%% of the weight on the query itself" % (
          kind, 100 * focus[kind]["self"])
      if kind == "routing":
        text += ", %.0f%% of queries in no cluster" % (100 * focus[kind]["unattended"])
      parts.append(text)
  return "; ".join(parts)


def plot_patterns(ids, records, path, sequence=0, focus=None):
  """Figure 1 with weights: for the top routing layer (or the top layer), the attention weights
  of one local head, the support of one routing head (colour = cluster) and that routing head's
  weights; weights on a log colour scale, white where a key gets none. Bottom row: the last 96
  positions. The suptitle has the layer's head focus over all eval sequences (`focus`: the
  focus_table, computed when not given)."""
  from matplotlib import colors  # pylint: disable=g-import-not-at-top
  plt = curves.pyplot()
  layers = layer_heads(records)
  routing_layers = [layer for layer, (_, _, r) in layers.items() if r is not None]
  layer = routing_layers[-1] if routing_layers else max(layers)
  probs, kinds, routing = layers[layer]
  n = probs.shape[-1]
  weights, _ = normalise_rows(probs[sequence])  # [h, n, n]
  panels = []  # (title, image or weights, is_weights)
  if "local" in kinds:
    panels.append(("local head: attention weights", weights[kinds.index("local")], True))
  if routing is not None:
    count = routing["centroids"].shape[1]
    cmap = plt.get_cmap("tab20" if count > 10 else "tab10")
    colours = cluster_colours(routing, n, sequence)
    image = np.ones([n, n, 3])
    for c in range(count):
      image[colours == c] = cmap(c % cmap.N)[:3]
    panels.append(("routing head: which keys it may see\n(colour = cluster, %d clusters)" % count,
                   image, False))
    panels.append(("routing head: attention weights", weights[kinds.index("routing")], True))
  focus = (focus or focus_table(ids, records))[layer]
  zoom = min(n, 96)
  norm = colors.LogNorm(vmin=1e-4, vmax=1.0)
  weight_cmap = plt.get_cmap("viridis").copy()
  weight_cmap.set_bad("white")
  fig, axes = plt.subplots(2, len(panels), figsize=(5.2 * len(panels), 10.5), squeeze=False)
  for column, (title, data, is_weights) in enumerate(panels):
    for row, (start, label) in enumerate(((0, ""), (n - zoom, "\nzoom on the last %d" % zoom))):
      ax = axes[row][column]
      extent = (start - 0.5, n - 0.5, n - 0.5, start - 0.5)
      if is_weights:
        shown = np.ma.masked_less_equal(data[start:, start:], 0.0)
        im = ax.imshow(shown, norm=norm, cmap=weight_cmap, interpolation="nearest", extent=extent)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight (log scale)")
      else:
        ax.imshow(data[start:, start:], interpolation="nearest", extent=extent)
      ax.set_title(title + label, fontsize=10)
      ax.set_xlabel("key position j")
      ax.set_ylabel("query position i")
  fig.suptitle("Layer %d, sequence %d: where each query's attention goes\n%s" % (
      layer, sequence, focus_title(focus)), fontsize=11)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_occupancy(ids, records, path):
  """Cluster occupancy per routing layer: grouped bars (clusters x heads)."""
  plt = curves.pyplot()
  routing = [(layer, r) for layer, (_, _, r) in layer_heads(records).items() if r is not None]
  shares = {}
  fig, axes = plt.subplots(1, max(len(routing), 1), figsize=(6 * max(len(routing), 1), 4),
                           squeeze=False)
  for ax, (layer, record) in zip(axes[0], routing):
    num_clusters = record["centroids"].shape[1]
    share = occupancy_shares(record["query_clusters"], num_clusters, ids != 0)
    shares[layer] = share
    width = 0.8 / share.shape[0]
    for h in range(share.shape[0]):
      ax.bar(np.arange(num_clusters) + h * width, share[h], width, label="routing head %d" % h)
    ax.axhline(1.0 / num_clusters, color="k", linestyle="--", linewidth=1, label="uniform")
    ax.set_xticks(np.arange(num_clusters) + 0.4 - width / 2)
    ax.set_xticklabels(range(num_clusters))
    ax.set_xlabel("cluster")
    ax.set_ylabel("share of positions (nearest centroid)")
    ax.set_title("layer %d" % layer)
    ax.legend(fontsize=8)
  if not routing:
    axes[0][0].text(0.5, 0.5, "no routing heads", ha="center")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return shares


def plot_js(table, path):
  """Table 6 as a figure: rows layers, columns pair kinds."""
  plt = curves.pyplot()
  cells = [["%.4f" % row[k]["mean"] if k in row else "-" for k in PAIR_KINDS]
           for row in table.values()]
  fig, ax = plt.subplots(figsize=(6.5, 0.6 + 0.4 * (len(cells) + 1)))
  ax.axis("off")
  ax.table(cellText=cells, rowLabels=["layer %d" % layer for layer in table],
           colLabels=list(PAIR_KINDS), loc="center", cellLoc="center")
  ax.set_title("Jensen-Shannon divergence between heads (nats, max ln 2 = %.4f)" % LN2,
               fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def analyse(checkpoint_dir, output_dir=None, **kwargs):
  """Collects the attention of a checkpoint and writes the pictures, tables and JSON."""
  output_dir = output_dir or os.path.join(checkpoint_dir, "analysis")
  os.makedirs(output_dir, exist_ok=True)
  ids, records = collect(checkpoint_dir, **kwargs)
  table = js_table(ids, records)
  focus = focus_table(ids, records)
  plot_patterns(ids, records, os.path.join(output_dir, "attention_patterns.png"), focus=focus)
  shares = plot_occupancy(ids, records, os.path.join(output_dir, "cluster_occupancy.png"))
  plot_js(table, os.path.join(output_dir, "head_js.png"))
  markdown = js_markdown(table)
  with open(os.path.join(output_dir, "head_js.md"), "w") as f:
    f.write(markdown)
  focus_md = focus_markdown(focus)
  with open(os.path.join(output_dir, "head_focus.md"), "w") as f:
    f.write(focus_md)
  markdown = focus_md + "\n" + markdown
  summary = {"checkpoint_dir": checkpoint_dir, "sequences": int(len(ids)),
             "focus": {str(k): v for k, v in focus.items()},
             "js": {str(k): v for k, v in table.items()},
             "occupancy": {str(k): v.tolist() for k, v in shares.items()}}
  with open(os.path.join(output_dir, "analysis.json"), "w") as f:
    json.dump(summary, f, indent=1)
  return summary, markdown, output_dir


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--checkpoint_dir", required=True, help="t2t-trainer --output_dir")
  parser.add_argument("--problem", help="default: from the run's flags_t2t.txt")
  parser.add_argument("--data_dir", help="default: from the run's flags_t2t.txt")
  parser.add_argument("--hparams_set", help="default: from the run's flags_t2t.txt")
  parser.add_argument("--num_sequences", type=int, default=4)
  parser.add_argument("--output_dir", help="default: CHECKPOINT_DIR/analysis")
  parser.add_argument("--t2t_usr_dir", help="comma-separated user directories (their problems "
                      "and hparams sets), as for t2t-trainer")
  args = parser.parse_args(argv)
  _, markdown, output_dir = analyse(args.checkpoint_dir, args.output_dir, problem=args.problem,
                                    data_dir=args.data_dir, hparams_set=args.hparams_set,
                                    num_sequences=args.num_sequences,
                                    t2t_usr_dir=args.t2t_usr_dir)
  print(markdown)
  print("analysis: wrote attention_patterns.png, cluster_occupancy.png, head_js.png, head_js.md, "
        "head_focus.md, analysis.json to %s" % output_dir)


if __name__ == "__main__":
  main()
