"""research/usr_dir: the books study's sets (research/books_routing_study.py), registered beside
every product set."""
import pytest



def learning_rates(hparams_sets, steps):
  """T2T's learning_rate_schedule of each hparams set at each global step: [sets, steps]."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensor2tensor.utils import learning_rate  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    rates = [learning_rate.learning_rate_schedule(hp) for hp in hparams_sets]
    with tf.compat.v1.Session() as sess:
      values = []
      for step in steps:
        global_step.load(step, sess)
        values.append(sess.run(rates))
  return np.array(values).T


def test_books_study_sets_are_the_demo_model_with_the_switches(registry):
  """The demo's routing model with the two switches, and the routing-only layout over 2,048
  tokens (every position in about one cluster, as at 1k)."""
  demo = registry.hparams("pg19_local_cluster_tiny2k")
  switches = registry.hparams("pg19_routing_switches_tiny2k")
  assert switches.routing_logit_scale == "rsqrt_depth" and switches.routing_exclude_self
  assert demo.routing_logit_scale == "none" and not demo.routing_exclude_self
  differ = {k for k, v in switches.values().items() if demo.values()[k] != v}
  assert differ == {"routing_logit_scale", "routing_exclude_self"}
  only = registry.hparams("pg19_routing_only_tiny2k")
  assert (only.local_num_heads, only.sparsity_cluster_num_heads, only.sparsity_skip_first) == (
      0, 4, 0)
  assert only.sparsity_cluster_size * only.sparsity_cluster_attention_window == only.max_length
  assert only.routing_logit_scale == "rsqrt_depth" and only.routing_exclude_self
  assert (only.hidden_size, only.num_hidden_layers, only.batch_size) == (
      demo.hidden_size, demo.num_hidden_layers, demo.batch_size)


def test_study_sets_are_not_product_sets(registry):
  import hparams  # pylint: disable=g-import-not-at-top
  from usr_dir import STUDY_SETS  # pylint: disable=g-import-not-at-top
  assert STUDY_SETS and not set(STUDY_SETS) & set(hparams.PROJECT_SETS)
  assert set(STUDY_SETS) <= set(registry.list_hparams())


@pytest.mark.parametrize("name", ["pg19_routing_switches_tiny2k", "pg19_routing_only_tiny2k"])
def test_study_sets_train_with_the_books_recipe(registry, name):
  """As the demo's sets: gain 1.0, Adafactor, 0.05 after a 100-step warm-up, then rsqrt decay."""
  hp = registry.hparams(name)
  assert hp.initializer_gain == 1.0 and hp.initializer == "uniform_unit_scaling"
  assert hp.optimizer == "adafactor" and hp.optimizer_adafactor_multiply_by_parameter_scale
  assert (hp.learning_rate_warmup_steps, hp.learning_rate_constant) == (100, 0.05)
  assert hp.learning_rate_schedule == "constant*linear_warmup*rsqrt_normalized_decay"
  rates = learning_rates([hp], (1, 50, 100, 400, 3000))[0]
  assert rates == pytest.approx([5e-4, 0.025, 0.05, 0.025, 0.05 * (100 / 3000) ** 0.5],
                                rel=1e-5)
