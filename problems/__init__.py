"""T2T problems of the Routing Transformer; importing this package registers them."""
# pylint: disable=g-import-not-at-top,wrong-import-position
from tensor2tensor.utils import registry

_BEFORE = set(registry.list_base_problems())
from problems import enwik8
from problems import images
from problems import pg19
from problems import retrieval
from problems import synthetic
from problems import wikitext103

PROJECT_PROBLEMS = tuple(sorted(set(registry.list_base_problems()) - _BEFORE))  # our problems
