"""Routing Transformer (Roy et al., TACL 2021) for TensorFlow 2, Tensor2Tensor and Mesh-TF."""
from routing_transformer import compat

compat.apply()
