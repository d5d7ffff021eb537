"""T2T problems of the Routing Transformer; importing this package registers them."""
from routing_transformer import compat

compat.apply()

# pylint: disable=g-import-not-at-top,wrong-import-position
from problems import enwik8
from problems import images
from problems import pg19
from problems import synthetic
from problems import wikitext103
