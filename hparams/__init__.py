"""Hparams sets of the Routing Transformer; importing this package registers them with T2T."""
# pylint: disable=g-import-not-at-top,wrong-import-position
# T2T's own sets (basic_1, ...) register when common_hparams is first imported: before _BEFORE.
from tensor2tensor.layers import common_hparams  # pylint: disable=unused-import
from tensor2tensor.utils import registry

_BEFORE = set(registry.list_hparams())
from hparams import base
from hparams import sets
from hparams import mtf  # routing_transformer_mtf sets

PROJECT_SETS = tuple(sorted(set(registry.list_hparams()) - _BEFORE))  # names of our sets
