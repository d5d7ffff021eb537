"""T2T problems of the Routing Transformer; importing this package registers them."""
from routing_transformer import compat

compat.apply()

from problems import synthetic  # pylint: disable=g-import-not-at-top,wrong-import-position
