"""Routing Transformer (Roy et al., TACL 2021) for TensorFlow 2, Tensor2Tensor and Mesh-TF.

core/: the model (attention, k-means, layers, decoding, Keras); t2t/: Tensor2Tensor glue;
tools/: command-line tools. Imports point tools -> t2t -> core. Importing the package changes
nothing outside it: the patches of Tensor2Tensor and TensorFlow are applied only by
`routing_transformer.t2t.patches.install()` (t2t_usr_dir and the tools call it).
"""
from routing_transformer import _quiet

_quiet.apply_if_command()  # the rt-* commands: before anything imports TensorFlow
