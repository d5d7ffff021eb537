"""Hparams sets of the Routing Transformer; importing this package registers them with T2T."""
from routing_transformer import compat

compat.apply()

from hparams import base  # pylint: disable=g-import-not-at-top,wrong-import-position
from hparams import sets  # pylint: disable=g-import-not-at-top,wrong-import-position
