"""The research studies' T2T user directory: this project's `t2t_usr_dir`, then the hparams sets
only the studies use.

    t2t-trainer --t2t_usr_dir=research/usr_dir --hparams_set=pg19_routing_switches_tiny2k ...
    python -m routing_transformer.tools.evaluate --t2t_usr_dir=research/usr_dir ...

The stock T2T binaries import one user directory: this one imports the project's first, so every
product set, problem and model stays registered beside the sets below.
"""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

# pylint: disable=g-import-not-at-top,unused-import,wrong-import-position,protected-access
import t2t_usr_dir  # the product: TF2 fixes, models, problems, hparams sets
from hparams import sets
from tensor2tensor.utils import registry

STUDY_SETS = ("pg19_routing_switches_tiny2k", "pg19_routing_only_tiny2k")


@registry.register_hparams
def pg19_routing_switches_tiny2k():
  """`pg19_local_cluster_tiny2k` (the demo's routing model) with the routing switches of
  `routing_only_transformer_tiny1k` (research/books_routing_study.py)."""
  return sets._routing_switches(sets.pg19_local_cluster_tiny2k())


@registry.register_hparams
def pg19_routing_only_tiny2k():
  """`pg19_local_cluster_tiny2k` laid out as `routing_only_transformer_tiny1k`: four routing heads
  in both layers (16 clusters x 128), no local heads, both switches
  (research/books_routing_study.py)."""
  hparams = sets._heads(sets.pg19_local_cluster_tiny2k(), local=0, routing=4, skip_first=0,
                        clusters=16, window=128)
  return sets._routing_switches(hparams)
