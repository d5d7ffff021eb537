"""What `--t2t_usr_dir=t2t_usr_dir` imports: TF2 fixes, then every model, hparams set and problem.

T2T imports this directory as a package by its path, so the repository root is put on sys.path
first (the project is used from its checkout, not installed).
"""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

# pylint: disable=g-import-not-at-top,unused-import,wrong-import-position
from routing_transformer.t2t import compat

compat.patch_tensor2tensor()

import hparams  # registers the hparams sets
import problems  # registers the problems
from routing_transformer.t2t import model  # registers routing_transformer / sparse_transformer
from routing_transformer.t2t import glue as t2t_glue
from routing_transformer.t2t.mtf import estimator as mtf_estimator  # routing_transformer_mtf

t2t_glue.guard_create_hparams()
t2t_glue.add_sampling_decode_hparams()
t2t_glue.guard_decode_from_file()
t2t_glue.guard_create_estimator()
t2t_glue.place_on_cpu_without_gpu()
t2t_glue.guard_checkpoints()
t2t_glue.guard_decoding_checkpoints()
t2t_glue.install_error_hook()
mtf_estimator.guard_create_hparams()
