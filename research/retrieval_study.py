"""One short training run on a one-hop retrieval layout: how fast does a model learn look-ups?

    python research/retrieval_study.py --hparams_set full_transformer_tiny1k \
        --layout long_range_retrieval_1k_mixed --steps 600 --eval_every 100 \
        [--hparams initializer_gain=1.0,...] [--sequences 4] [--seed 1] [--out FILE.jsonl]

`--layout` is a registered retrieval problem or an inline mixed layout
`mixed:LENGTH,PAIRS,KEYS,VALUES,LO-HI/LO-HI/...` (problems/retrieval.py `MixedLayout`).
A plain session loop (no t2t-trainer start-up, no checkpoints): the registered model, T2T's
optimizer and learning-rate schedule of the hparams set, `--sequences` fresh sequences per step
(seed 1000 * seed + step), and every `--eval_every` steps the accuracy on 32 held-out sequences
(the model in EVAL mode on the trained variables) per distance band and near/far of the local
heads' reach (full attention: the reach its
query_shape/memory_flange would give), train/eval loss, and for routing layers the diagnostics
of the last training batch (share of queries in no cluster, self-attention share, cluster
occupancy) and, on the held-out far look-ups, `lookup_diagnostics`: how often the query token
and its item share a routing cluster and how close their routed vectors are.
One JSON line per evaluation to stdout and `--out`.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

NUM_EVAL = 32


def parse_layout(spec):
  """A registered problem name, or 'mixed:LENGTH,PAIRS,KEYS,VALUES,LO-HI/LO-HI'."""
  from problems import retrieval  # pylint: disable=g-import-not-at-top
  if spec in retrieval.LAYOUTS:
    return retrieval.LAYOUTS[spec]
  if not spec.startswith("mixed:"):
    raise SystemExit("retrieval_study: --layout %r is neither one of %s nor mixed:LENGTH,PAIRS,"
                     "KEYS,VALUES,LO-HI/LO-HI" % (spec, ", ".join(sorted(retrieval.LAYOUTS))))
  length, pairs, keys, values, bands = spec[len("mixed:"):].split(",")
  bands = tuple(tuple(int(x) for x in b.split("-")) for b in bands.split("/"))
  layout = retrieval.MixedLayout(int(length), int(pairs), int(keys), int(values), bands)
  retrieval.check_mixed_layout(layout)
  return layout


def samples(layout, seed, num):
  """(sequences [num, n], answer distances [num, n], -1 off answers) of any layout."""
  from problems import retrieval  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  if isinstance(layout, retrieval.MixedLayout):
    return retrieval.generate_mixed_samples(seed, num, layout, with_distances=True)
  seqs = retrieval.generate_samples(seed, num, layout)
  return seqs, retrieval.answer_distances(seqs, layout).astype(np.int64)


def bands_of(layout):
  if hasattr(layout, "bands"):
    return [tuple(b) for b in layout.bands]
  return [(layout.min_far_distance, layout.length)]


def accuracies(correct, dists, layout, reach):
  """{name: accuracy} per band, near (d <= reach) and far (d > reach), from [num, n] arrays."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  groups = {"d%d_%d" % b: (dists >= b[0]) & (dists <= b[1]) for b in bands_of(layout)}
  groups["near"] = (dists >= 1) & (dists <= reach)
  groups["far"] = dists > reach
  return {k: (round(float(correct[m].mean()), 4) if m.any() else None) for k, m in groups.items()}


def top_window_np(scores, window):
  """NumPy twin of `routing.top_window` without padding: bool members [b, h, c, n]."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  top = np.argpartition(-scores, window - 1, axis=-1)[..., :window]
  members = np.zeros(scores.shape, bool)
  np.put_along_axis(members, top, True, axis=-1)
  return members


def lookup_diagnostics(q_hat, k_hat, means, window, dists, reach):
  """Where routing stands on the far look-ups of one batch (causal routing: cluster members are
  chosen by the queries' centroid scores, the keys are the query members).

  Args:
    q_hat, k_hat: [b, h, n, d] normalised queries and keys of one routing layer (one array with
      share_qk), at the model's positions (position t reads token t - 1).
    means: [h, c, d] centroids.
    window: members per cluster.
    dists: [b, n] look-up distance at each answer position (query token one before), else -1:
      the query token is read at model position `answer`, its item at `answer - d`.
    reach: far look-ups have d > reach.
  Returns:
    dict of floats over the far look-ups: "item_cocluster" share whose query token and item share
    a cluster in some head, "query_in_cluster" share whose query token is in some cluster,
    "item_cosine" mean over heads of cos(q_hat query, k_hat item), "other_cosine" the same for
    the query and every earlier position (a baseline), "item_rank" mean over heads of the share of
    earlier positions the item's logit beats.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  members = top_window_np(np.einsum("hcd,bhnd->bhcn", means, q_hat), window)
  b_idx, answer = np.nonzero(dists > reach)
  if not b_idx.size:
    return {}
  # Model positions: the model shifts its targets right, so position t reads token t - 1. The
  # answer's position reads the query token and predicts the item; the item token (sequence
  # index answer - 1 - d) is read at position answer - d.
  query = answer
  item = answer - dists[b_idx, answer]
  shared = (members[b_idx, :, :, query] & members[b_idx, :, :, item]).any(axis=(1, 2))
  in_cluster = members[b_idx, :, :, query].any(axis=(1, 2))
  depth = q_hat.shape[-1]
  logits = np.einsum("khd,bhnd->khbn", q_hat[b_idx, :, query], k_hat) / depth  # cosines
  logits = logits[np.arange(b_idx.size), :, b_idx]  # [k, h, n]
  earlier = np.arange(q_hat.shape[2])[None, :] < query[:, None]  # [k, n]
  item_cos = logits[np.arange(b_idx.size), :, item]  # [k, h]
  other = np.where(earlier[:, None, :], logits, 0).sum(-1) / earlier.sum(-1)[:, None]
  beats = ((logits < item_cos[..., None]) & earlier[:, None, :]).sum(-1) / np.maximum(
      earlier.sum(-1)[:, None] - 1, 1)
  return {"item_cocluster": float(shared.mean()), "query_in_cluster": float(in_cluster.mean()),
          "item_cosine": float(item_cos.mean()), "other_cosine": float(other.mean()),
          "item_rank": float(beats.mean())}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="routing_transformer",
                      help="registered T2T model (transformer: T2T's own decoder as a peer)")
  parser.add_argument("--hparams_set", default="full_transformer_tiny1k")
  parser.add_argument("--layout", "--problem", default="long_range_retrieval_1k_mixed")
  parser.add_argument("--hparams", default="")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--eval_every", type=int, default=100)
  parser.add_argument("--sequences", type=int, default=4)
  parser.add_argument("--seed", type=int, default=1)
  parser.add_argument("--out", default="")
  parser.add_argument("--label", default="")
  parser.add_argument("--control", choices=["", "unnormalised_routing_qk"], default="",
                      help="study control, not a model option: unnormalised_routing_qk gives "
                           "the routing heads raw queries and keys (no layer norm before the "
                           "centroid scores and the logits); with one cluster of all positions "
                           "and routing_logit_scale=rsqrt_depth they are standard dense heads")
  args = parser.parse_args(argv)

  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from problems import retrieval  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import cost  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import kmeans  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import hparams_lib  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  if args.model == "transformer":  # registers T2T's transformer and transformer_tiny
    from tensor2tensor.models import transformer  # pylint: disable=g-import-not-at-top,unused-import
  tf1 = tf.compat.v1
  tf.get_logger().setLevel("ERROR")
  if args.control == "unnormalised_routing_qk":
    from routing_transformer.core.attention import common  # pylint: disable=g-import-not-at-top
    common.layer_norm_no_scale = tf.identity  # read by routing.normalised_inputs only

  layout = parse_layout(args.layout)
  n = layout.length
  overrides = "max_length=%d" % n
  if "max_target_length" in trainer_lib.create_hparams(args.hparams_set).values():
    overrides += ",max_target_length=%d" % n
  overrides += ("," + args.hparams) if args.hparams else ""
  base = retrieval.MixedRetrieval if hasattr(layout, "bands") else retrieval.LongRangeRetrieval
  problem = type("StudyLayout", (base,), {"layout": layout})()

  def make_hparams():
    hp = trainer_lib.create_hparams(args.hparams_set, overrides)
    hp.batch_size = n * args.sequences
    hparams_lib.add_problem_hparams(hp, problem)  # checks the layout against the model
    return hp

  hparams = make_hparams()
  if "query_shape" in hparams.values():
    reach = cost.local_receptive_field(hparams, n, as_local=True)
    flops_vs_full, memory_vs_full = cost.relative_to_full(hparams, n)
  else:  # a peer without local heads: full attention, "far" past the tiny sets' reach
    reach = cost.local_receptive_field(
        trainer_lib.create_hparams("local_transformer_tiny1k", "max_length=%d,"
                                   "max_target_length=%d" % (n, n)), n)
    flops_vs_full = memory_vs_full = 1.0
  eval_seqs, eval_dists = samples(layout, retrieval.EVAL_SEED, NUM_EVAL)

  with tf.Graph().as_default():
    tf1.set_random_seed(args.seed)
    np.random.seed(args.seed)
    tf1.train.get_or_create_global_step()
    ids = tf1.placeholder(tf.int32, [args.sequences, n])
    model = registry.model(args.model)(hparams, tf.estimator.ModeKeys.TRAIN)
    logits, losses = model({"targets": ids[:, :, None, None]})
    loss = tf.add_n(list(losses.values()))  # "extra_loss" carries the commitment loss and,
    # through a control dependency, the centroid update (as under T2T's estimator)
    train_op = model.optimize(loss)
    diagnostics = {}
    for layer, steps in sorted(getattr(model, "_kmeans_steps", {}).items()):  # pylint: disable=protected-access
      counts = tf.add_n([s.statistics()[0] for s in steps]) / len(steps)
      for key, value in kmeans.occupancy(counts).items():
        diagnostics["%s/%s" % (layer, key)] = value
      for key in steps[0].routing_statistics:
        diagnostics["%s/%s" % (layer, key)] = tf.add_n(
            [s.routing_statistics[key] for s in steps]) / len(steps)
    routed = {}  # layer: (q_hat, k_hat, means) of the first shard, for lookup_diagnostics
    for layer, steps in sorted(getattr(model, "_kmeans_steps", {}).items()):  # pylint: disable=protected-access
      x_hats = steps[0].x_hats
      routed[layer] = (x_hats[0], x_hats[-1], steps[0].km.means)
    # Evaluation: the same model in EVAL mode on the same variables (no dropout, no centroid
    # update, no train-time routing noise), in chunks of the static batch.
    eval_model = registry.model(args.model)(make_hparams(), tf.estimator.ModeKeys.EVAL,
                                            _reuse=True)
    eval_logits, _ = eval_model({"targets": ids[:, :, None, None]})
    eval_logits = eval_logits[:, :, 0, 0, :]
    pred_op = tf.argmax(eval_logits, axis=-1, output_type=tf.int32)
    xent_op = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=eval_logits)
    started = time.time()
    records = []
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
      train_losses = []
      for step in range(1, args.steps + 1):
        batch, _ = samples(layout, 1000 * args.seed + step, args.sequences)
        evaluate = step % args.eval_every == 0 or step == args.steps
        fetches = [train_op, losses["training"]] + ([diagnostics] if evaluate else [])
        out = sess.run(fetches, {ids: batch})
        train_losses.append(float(out[1]))
        if not evaluate:
          continue
        train_seconds = time.time() - started
        outs = [sess.run([pred_op, xent_op, routed], {ids: eval_seqs[i:i + args.sequences]})
                for i in range(0, NUM_EVAL, args.sequences)]
        lookups = {}
        for layer in routed:
          parts = [lookup_diagnostics(*o[2][layer], hparams.sparsity_cluster_attention_window,
                                      eval_dists[i * args.sequences:(i + 1) * args.sequences],
                                      reach) for i, o in enumerate(outs)]
          parts = [p for p in parts if p]
          for key in (parts[0] if parts else ()):
            lookups["%s/%s" % (layer, key)] = round(float(np.mean([p[key] for p in parts])), 4)
        pred = np.concatenate([o[0] for o in outs])
        xent = np.concatenate([o[1] for o in outs])
        answers = eval_dists >= 1
        record = dict(
            label=args.label, model=args.model, hparams_set=args.hparams_set, hparams=args.hparams,
            layout=args.layout, control=args.control, sequences=args.sequences, seed=args.seed, step=step,
            seconds=round(train_seconds, 1), steps_per_second=round(step / train_seconds, 3),
            reach=reach, attention_flops_vs_full=round(flops_vs_full, 4),
            attention_memory_vs_full=round(memory_vs_full, 4),
            train_loss=round(float(np.mean(train_losses[-args.eval_every:])), 4),
            eval_loss=round(float(xent.mean()), 4),
            eval_answer_loss=round(float(xent[answers].mean()), 4),
            accuracy=accuracies(pred == eval_seqs, eval_dists, layout, reach),
            diagnostics={k: round(float(v), 4) for k, v in out[2].items()},
            lookup_diagnostics=lookups, lookup_positions="model")  # see lookup_diagnostics
        records.append(record)
        line = json.dumps(record)
        print(line, flush=True)
        if args.out:
          with open(args.out, "a") as f:
            f.write(line + "\n")
  return records


if __name__ == "__main__":
  main()
