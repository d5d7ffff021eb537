"""analysis.py (attention pictures, occupancy, head JS divergence) and curves.py."""
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import HParamsStandIn
from routing_transformer.tools import analysis
from routing_transformer.tools import curves

tf1 = tf.compat.v1


def test_js_divergence_hand_numbers():
  p = np.array([[1.0, 0.0], [0.5, 0.5], [0.3, 0.7]])
  q = np.array([[0.0, 1.0], [1.0, 0.0], [0.3, 0.7]])
  # Row 2: m = (0.75, 0.25); 0.5 (0.5 ln(2/3) + 0.5 ln 2) + 0.5 ln(4/3) = 0.215762.
  np.testing.assert_allclose(analysis.js_divergence(p, q), [np.log(2), 0.215762, 0.0],
                             atol=1e-6)
  assert analysis.LN2 == pytest.approx(0.6931, abs=1e-4)


def test_head_pair_js_groups_pairs_by_kind():
  n = 4
  same = np.eye(n)  # heads 0, 1 (local) attend to themselves; head 2 (routing) to the next token
  shifted = np.roll(np.eye(n), 1, axis=1)
  probs = np.stack([same, same, shifted])[np.newaxis]
  valid = np.ones([1, 3, n], bool)
  valid[0, 2, 0] = False  # a routing query in no cluster: left out of its pairs
  table = analysis.head_pair_js(probs, valid, ["local", "local", "routing"])
  assert table["local-local"] == {"mean": 0.0, "pairs": 1}
  assert table["local-routing"]["pairs"] == 2
  assert table["local-routing"]["mean"] == pytest.approx(np.log(2))
  assert "routing-routing" not in table


def test_occupancy_shares_leave_out_padding():
  clusters = np.array([[[0, 0, 1, 2]], [[2, 2, 2, 2]]])  # [b=2, h=1, n=4]
  real = np.array([[True] * 4, [True, True, False, False]])
  np.testing.assert_allclose(analysis.occupancy_shares(clusters, 3, real),
                             [[2 / 6, 1 / 6, 3 / 6]])


def hparams(**overrides):
  h = HParamsStandIn(
      hidden_size=32, local_num_heads=2, sparsity_cluster_num_heads=2, sparsity_skip_first=0,
      sparsity_cluster_size=4, sparsity_cluster_attention_window=16, query_shape=(16,),
      memory_flange=(16,), share_qk=True, routing_mode="topk", random_routing=False,
      legacy_causal_key_routing=False,
      max_relative_position=0, local_relative=True, sparsity_cluster_relative=True,
      head_dense=True, attention_dropout=0.0, decay=0.999, beta=1e-4, ema=True)
  h.__dict__.update(overrides)
  return h


@pytest.mark.parametrize("routing_mode", ["topk", "causal_window"])
def test_recorded_probabilities_reproduce_the_attention_outputs(rng, routing_mode):
  """probs @ v equals every head's real output; the pattern obeys causality and locality."""
  from routing_transformer.core import layers  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import attention  # pylint: disable=g-import-not-at-top
  from routing_transformer.core import heads  # pylint: disable=g-import-not-at-top
  n = 64
  records = []
  original_layer = layers.self_attention
  originals = {name: getattr(attention, name)
               for name in ("routing_attention", "causal_window_attention", "local_attention")}
  with tf.Graph().as_default(), analysis.recording_attention(records):
    x = tf.constant(rng.normal(size=(2, n, 32)).astype(np.float32))
    layers.self_attention(x, hparams(routing_mode=routing_mode), 0, None)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      fetched = sess.run([{k: v for k, v in r.items() if tf.is_tensor(v)} for r in records])
  assert [r["kind"] for r in records] == ["routing", "local"]
  assert layers.self_attention is original_layer  # nothing patched: the heads are observed
  assert all(getattr(attention, name) is f for name, f in originals.items())
  assert not heads._OBSERVERS  # pylint: disable=protected-access
  for record, values in zip(records, fetched):
    probs = values["probs"]
    np.testing.assert_allclose(probs @ values["values"], values["output"], rtol=1e-4, atol=1e-5)
    assert np.all(np.triu(probs, k=1) == 0)  # causal: no input after the output
    if record["kind"] == "local":  # block 16 + flange 16: j >= start of the previous block
      i, j = np.indices([n, n])
      assert np.all(probs[:, :, (j < (i // 16 - 1) * 16)] == 0)
      np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    else:
      record.update(values)
      colours = analysis.cluster_colours(record, n)
      assert np.all(colours[probs[0, 0] > 0] >= 0)  # every attended input has its cluster
      clusters = values["query_clusters"][0, 0]
      if routing_mode == "causal_window":  # attention stays inside the query's own cluster
        i, j = np.nonzero(probs[0, 0])
        assert np.all(clusters[i] == clusters[j])
        np.testing.assert_array_equal(colours[i, j], clusters[i])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """A routing_transformer_tiny checkpoint (initial weights) + a small synthetic eval set, with
  the flags_t2t.txt t2t-trainer would write."""
  import t2t_usr_dir  # pylint: disable=g-import-not-at-top,unused-import
  from problems import synthetic  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import registry  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import trainer_lib  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path_factory.mktemp("data"))
  run_dir = str(tmp_path_factory.mktemp("run"))
  problem = synthetic.SyntheticLongRange()
  problem.num_train, problem.num_eval = 8, 4
  problem.generate_data(data_dir, str(tmp_path_factory.mktemp("tmp")))
  h = trainer_lib.create_hparams("routing_transformer_tiny", data_dir=data_dir,
                                 problem_name="synthetic_long_range")
  with tf.Graph().as_default():
    model = registry.model("routing_transformer")(h, tf.estimator.ModeKeys.TRAIN)
    model({"targets": tf1.placeholder(tf.int32, [2, 512, 1, 1])})
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      tf1.train.Saver().save(sess, os.path.join(run_dir, "model.ckpt"), global_step=0)
  with open(os.path.join(run_dir, "flags_t2t.txt"), "w") as f:
    f.write("--problem=synthetic_long_range\n--data_dir=%s\n--hparams_set="
            "routing_transformer_tiny\n" % data_dir)
  return run_dir


def test_analysis_cli_writes_pictures_and_table(checkpoint, tmp_path, capsys):
  out = str(tmp_path / "analysis")
  analysis.main(["--checkpoint_dir", checkpoint, "--num_sequences", "2", "--output_dir", out])
  assert "| layer | local-local | local-routing | routing-routing |" in capsys.readouterr().out
  for name in ("attention_patterns.png", "cluster_occupancy.png", "head_js.png"):
    image = __import__("matplotlib.pyplot").pyplot.imread(os.path.join(out, name))
    assert image.shape[0] > 100 and image.std() > 0, name
  import json  # pylint: disable=g-import-not-at-top
  with open(os.path.join(out, "analysis.json")) as f:
    summary = json.load(f)
  # routing_transformer_tiny: layer 0 has 4 local heads, layer 1 two routing + two local heads.
  assert sorted(summary["js"]["0"]) == ["local-local"]
  assert summary["js"]["0"]["local-local"]["pairs"] == 6
  assert {k: v["pairs"] for k, v in summary["js"]["1"].items()} == {
      "local-local": 1, "local-routing": 4, "routing-routing": 1}
  for row in summary["js"].values():
    for value in row.values():
      assert 0.0 < value["mean"] < analysis.LN2
  shares = np.array(summary["occupancy"]["1"])
  assert shares.shape == (2, 8)
  np.testing.assert_allclose(shares.sum(axis=1), 1.0)


def test_analysis_without_a_checkpoint_says_so(tmp_path):
  with pytest.raises(SystemExit, match="no checkpoint in"):
    analysis.main(["--checkpoint_dir", str(tmp_path)])


def write_run(run_dir, losses, start):
  """Event files as t2t-trainer writes them: training scalars in run_dir, eval in eval/."""
  for sub, points in (("", losses), ("eval", losses[-1:])):
    with tf.Graph().as_default():  # FileWriter is graph-mode only
      writer = tf1.summary.FileWriter(os.path.join(run_dir, sub))
      for step, value in points:
        summary = tf1.Summary(value=[tf1.Summary.Value(tag="loss", simple_value=value)])
        writer.add_event(tf1.Event(wall_time=start + 2.0 * step, step=step, summary=summary))
      writer.close()


def test_curves_read_runs_and_plot(tmp_path):
  write_run(str(tmp_path / "a"), [(0, 5.0), (100, 3.0), (200, 2.5)], 1000.0)
  write_run(str(tmp_path / "b"), [(0, 5.0), (100, 4.0)], 5000.0)
  out = str(tmp_path / "curves.png")
  data = curves.plot_runs([("routing", str(tmp_path / "a")), ("local", str(tmp_path / "b"))],
                          out)
  assert [(s, v) for s, _, v in data["routing"]["train"]] == [(0, 5.0), (100, 3.0), (200, 2.5)]
  assert data["routing"]["train"][-1][1] - data["routing"]["train"][0][1] == 400.0
  assert [(s, v) for s, _, v in data["local"]["eval"]] == [(100, 4.0)]
  assert os.path.getsize(out) > 10000
  with pytest.raises(SystemExit, match="no 'accuracy' scalars"):
    curves.plot_runs([("a", str(tmp_path / "a"))], out, tag="accuracy")


def test_curves_smooth_dense_log_points_on_event_wall_times(tmp_path):
  write_run(str(tmp_path / "a"), [(0, 5.0), (100, 3.0), (200, 2.5)], 1000.0)
  with tf.Graph().as_default():  # Estimator evaluated the last step twice: one point
    writer = tf1.summary.FileWriter(str(tmp_path / "a" / "eval"))
    summary = tf1.Summary(value=[tf1.Summary.Value(tag="loss", simple_value=2.75)])
    writer.add_event(tf1.Event(wall_time=1500.0, step=200, summary=summary))
    writer.close()
  logged = [(0, 5.0), (50, 4.0), (100, 3.5), (150, 3.0), (200, 2.5)]
  data = curves.plot_runs([("routing", str(tmp_path / "a"))], str(tmp_path / "c.png"),
                          train_points={"routing": logged})
  # wall times interpolated between the events' (step, wall_time): 1000 + 2 step
  assert data["routing"]["train"] == [(s, 1000.0 + 2.0 * s, v) for s, v in logged]
  assert [(s, v) for s, _, v in data["routing"]["eval"]] == [(200, 2.75)]
  # span = 200 / 20 steps; 50 steps apart: a = exp(-5)
  a = np.exp(-50 / (200 * curves.SPAN_FRACTION))
  expected = [5.0]
  for _, v in logged[1:]:
    expected.append(a * expected[-1] + (1 - a) * v)
  np.testing.assert_allclose(data["routing"]["smoothed"], expected)
  table = curves.final_numbers(data)
  assert table["routing"]["step"] == 200 and table["routing"]["evals"] == 1
  assert table["routing"]["eval"] == pytest.approx(2.75)
  row = "| routing | 200 | %.4f | 2.7500 (200) | 1 |" % expected[-1]
  assert row in curves.final_markdown(table)


def test_ema_over_uneven_steps_hand_numbers():
  a1, a2 = np.exp(-1.0), np.exp(-2.0)  # span 10: steps 10 and 20 apart
  first = a1 * 1.0 + (1 - a1) * 2.0
  np.testing.assert_allclose(curves.ema([0, 10, 30], [1.0, 2.0, 4.0], 10.0),
                             [1.0, first, a2 * first + (1 - a2) * 4.0])


def test_focus_title_names_self_weight_and_unclustered_queries():
  focus = {"local": {"self": 0.214, "unattended": 0.0},
           "routing": {"self": 0.371, "unattended": 0.125}}
  assert analysis.focus_title(focus) == (
      "routing heads: 37% of the weight on the query itself, 12% of queries in no cluster; "
      "local heads: 21% of the weight on the query itself")


def test_head_focus_hand_numbers():
  probs = np.zeros([1, 2, 3, 3])
  probs[0, 0] = [[1, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]]  # local
  probs[0, 1] = [[1, 0, 0], [0, 0, 0], [0, 0.02, 0.98]]      # routing; query 1 in no cluster
  probs, valid = analysis.normalise_rows(probs)
  focus = analysis.head_focus(probs, valid, ["local", "routing"])
  np.testing.assert_allclose([focus["local"][k] for k in analysis.FOCUS_KEYS], [0.5, 0.5, 2.5, 0])
  np.testing.assert_allclose([focus["routing"][k] for k in analysis.FOCUS_KEYS],
                             [0.98, 0.98, 2, 0.5])
  assert focus["local"]["rows"] == 2 and focus["routing"]["rows"] == 1
  padded = analysis.head_focus(probs, valid, ["local", "routing"], np.array([[1, 1, 0]], bool))
  assert padded["routing"]["unattended"] == 1.0 and padded["local"]["self"] == 0.5
