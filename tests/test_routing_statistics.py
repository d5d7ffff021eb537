"""Routing's own diagnostics as TRAIN summaries: the share of queries in no cluster and the
share of attention on self (routing.routing_statistics), beside the cluster balance."""
import numpy as np
import pytest
import tensorflow as tf

from routing_transformer.core import attention
from routing_transformer.core.attention import routing
from test_model import EVAL, TRAIN, build, random_targets, small_hparams

tf1 = tf.compat.v1


def test_statistics_against_hand_numbers():
  member_count = np.array([[[0, 1, 2, 0], [1, 1, 1, 3]]], np.float32)  # [b=1, h=2, n=4]
  self_weight = np.array([[[0.0, 0.5, 0.2, 0.0], [1.0, 0.3, 0.2, 0.1]]], np.float32)
  weights = np.array([[1, 1, 1, 0]], np.float32)  # the last position is padding
  stats = routing.routing_statistics(member_count, self_weight, weights)
  # Real queries: 6; in no cluster: (h0, pos 0) -> 1/6. In a cluster: 5, self 0.5+0.2+1+0.3+0.2.
  assert float(stats["no_cluster_share"]) == pytest.approx(1.0 / 6)
  assert float(stats["self_attention_share"]) == pytest.approx(2.2 / 5)


def _one_hot_values(rng, n=16, d=16):
  """Random q, k and v = identity: output[i, j] is the weight of query i on key j."""
  q = rng.standard_normal((1, 2, n, d)).astype(np.float32)
  v = np.broadcast_to(np.eye(n, d, dtype=np.float32), (1, 2, n, d)).copy()
  centroids = attention.layer_norm_no_scale(
      tf.constant(rng.standard_normal((2, 4, d)), tf.float32))
  return q, v, centroids


@pytest.mark.parametrize("mode,exclude_self", [("topk", False), ("topk", True),
                                               ("causal_window", False)])
def test_self_weight_and_membership_are_read_off_the_attention(rng, mode, exclude_self):
  q, v, centroids = _one_hot_values(rng)
  if mode == "topk":
    out, aux = attention.routing_attention(q, q, v, centroids, 4, exclude_self=exclude_self)
    members = np.zeros((1, 2, 16))
    for (b, h, c, w), i in np.ndenumerate(aux["query_indices"].numpy()):
      members[b, h, i] += 1
  else:
    out, aux = attention.causal_window_attention(q, q, v, centroids, 4)
    members = np.ones((1, 2, 16))
  out = out.numpy()
  diag = np.einsum("bhii->bhi", out)  # the weight on self (the output is scaled by count / (count + 0.01))
  count = aux["member_count"].numpy()
  np.testing.assert_array_equal(count, members)
  np.testing.assert_allclose(aux["self_weight"].numpy(), diag, atol=1e-6)
  assert (np.abs(out[count == 0]) < 1e-7).all()
  if mode == "topk":
    assert (count == 0).any(), "4 clusters x 4 < 16 leaves some queries out (the case we test)"


@pytest.mark.parametrize("mode", ["topk", "causal_window"])
def test_train_graph_writes_the_scalars_per_routing_layer(rng, mode):
  h = small_hparams(routing_mode=mode)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    build(h, TRAIN, {"targets": random_targets(rng)})
    names = [op.name for op in tf1.get_collection(tf1.GraphKeys.SUMMARIES)]
    for key in ("no_cluster_share", "self_attention_share", "occupancy_entropy",
                "occupancy_max"):
      assert [n for n in names if n.startswith("routing/") and key in n], (key, names)
    values = tf1.summary.merge_all()
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      summary = tf1.Summary.FromString(sess.run(values))
  got = {v.tag.split("/")[-1]: v.simple_value for v in summary.value if "share" in v.tag}
  assert 0.0 <= got["no_cluster_share"] <= 1.0 and 0.0 < got["self_attention_share"] <= 1.0
  if mode == "causal_window":
    assert got["no_cluster_share"] == 0.0


def test_no_routing_scalars_without_routing_heads_or_outside_train(rng):
  for h, mode in ((small_hparams(sparsity_cluster_num_heads=0, local_num_heads=4), TRAIN),
                  (small_hparams(), EVAL)):
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      build(h, mode, {"targets": random_targets(rng)})
      names = [op.name for op in tf1.get_collection(tf1.GraphKeys.SUMMARIES)]
      assert not [n for n in names if "share" in n]
