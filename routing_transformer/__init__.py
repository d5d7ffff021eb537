"""Routing Transformer (Roy et al., TACL 2021) for TensorFlow 2, Tensor2Tensor and Mesh-TF.

core/: the model (attention, k-means, layers, decoding, Keras); t2t/: Tensor2Tensor glue;
tools/: command-line tools. Imports point tools -> t2t -> core.
"""
from routing_transformer import _quiet

_quiet.apply_if_command()  # the rt-* commands: before anything imports TensorFlow

# pylint: disable=g-import-not-at-top,wrong-import-position
from routing_transformer import _moved
from routing_transformer.t2t import compat

_moved.install()
compat.apply()
