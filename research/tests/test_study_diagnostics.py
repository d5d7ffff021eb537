"""research/retrieval_study.py's look-up diagnostics against hand-built routing geometry, and
research/lookup_study.py's phases."""
import numpy as np

from conftest import research_module as benchmark


def study():
  return benchmark("retrieval_study")


def test_top_window_np_picks_the_best_positions_per_cluster():
  scores = np.array([[[[0.1, 0.9, 0.5, 0.3], [0.8, 0.0, 0.2, 0.7]]]])  # [1, 1, 2, 4]
  members = study().top_window_np(scores, 2)
  np.testing.assert_array_equal(members[0, 0], [[False, True, True, False],
                                                [True, False, False, True]])


def test_lookup_diagnostics_on_hand_built_vectors():
  """Two sequences of 8 model positions (position t reads token t - 1), centroids e0 and e1,
  window 4, reach 3. An answer at position a with distance d: the query token is read at a, its
  item at a - d.
  Sequence 0: the query at 6 and its item at 2 both along e0: they share cluster e0 and the
  item is the only earlier key the query is close to (beats all 5 others).
  Sequence 1: query at 6 along e1, item at 1 along -e1; cluster e0 is exactly positions 2-5, cluster
  e1 holds 6 and never 1 (its lowest score): no shared cluster, the item beats no other key."""
  d = 4
  e = np.eye(d) * np.sqrt(d)  # normalised vectors have |x|^2 = d
  q = np.zeros((2, 1, 8, d))
  q[0, 0] = [e[2], e[3], e[0], e[2], e[3], e[2], e[0], e[3]]
  q[1, 0] = [e[2], -e[1], e[0], e[0], e[0], e[0], e[1], e[3]]
  means = np.stack([e[0], e[1]])[None] / np.sqrt(d)  # [1, 2, d]
  dists = -np.ones((2, 8), np.int64)
  dists[0, 6] = 4  # answer at 6: the query token read at 6, its item at 2
  dists[1, 6] = 5  # answer at 6: the query token read at 6, its item at 1
  out = study().lookup_diagnostics(q, q, means, 4, dists, reach=3)
  assert out == {"item_cocluster": 0.5, "query_in_cluster": 1.0, "item_cosine": 0.0,
                 "other_cosine": 0.0, "item_rank": 0.5}
  dists[1, 6] = 2  # a near look-up is left out
  near_left_out = study().lookup_diagnostics(q, q, means, 4, dists, reach=3)
  assert (near_left_out["item_cocluster"], near_left_out["item_cosine"]) == (1.0, 1.0)
  assert study().lookup_diagnostics(q, q, means, 4, dists, reach=10) == {}
  shifted = dists.copy()  # the answer one position later: another query (e3) and item (e2)
  shifted[0, 6], shifted[0, 7] = -1, 4
  assert study().lookup_diagnostics(q, q, means, 4, shifted, reach=3)["item_cosine"] == 0.0


def lookup_study():
  return benchmark("lookup_study")


def test_lookup_study_overrides_keep_the_last_value_of_a_name():
  overrides = lookup_study().overrides
  assert overrides("a=1,b=2", "", "a=3,c=x*y") == "b=2,a=3,c=x*y"
  assert overrides("") == ""


def test_lookup_study_phases_run_the_learning_rate_they_measured():
  """The tiny sets now hold 0.01 after the warm-up; phases A-J measured the decay from 0.05, so
  their runs name it, K and L run the held 0.01, and phase I's variants keep their one change."""
  study = lookup_study()

  def rate(run):
    hp = dict(x.split("=", 1) for x in study.overrides(run.hparams).split(","))
    return hp.get("learning_rate_schedule"), float(hp.get("learning_rate_constant", "nan"))

  decay, held = "constant*linear_warmup*rsqrt_normalized_decay", "constant*linear_warmup"
  for phase in "BCDEFGHJO":
    for run in study.PHASES[phase]():
      assert rate(run) == (decay, 0.05), (phase, run.label)
  assert rate(study.PHASES["A"]()[0]) == (decay, 0.05)  # the control
  assert [rate(run) for run in study.PHASES["I"]()] == [(held, 0.05), (decay, 0.02), (held, 0.01)]
  for phase in "KLMN":
    assert {rate(run) for run in study.PHASES[phase]()} == {(held, 0.01)}, phase
