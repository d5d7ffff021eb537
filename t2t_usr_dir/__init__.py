"""What `--t2t_usr_dir=t2t_usr_dir` imports: every patch of T2T (`routing_transformer.t2t.patches`:
TF 2.15 fixes, one-line errors, checkpoints, decoding), then every model, hparams set and problem.

T2T imports this directory as a package by its path, so the repository root is put on sys.path
first (the project is used from its checkout, not installed).
"""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

# pylint: disable=g-import-not-at-top,unused-import,wrong-import-position
from routing_transformer.t2t import patches

patches.install()

import hparams  # registers the hparams sets
import problems  # registers the problems
from routing_transformer.t2t import model  # registers routing_transformer / sparse_transformer
from routing_transformer.t2t.mtf import estimator as mtf_estimator  # routing_transformer_mtf
