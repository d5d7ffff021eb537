"""Mesh-TensorFlow port of the Routing Transformer (model parallelism
on TPU slices; the T2T model is the reference).

attention: local and routing attention with named dimensions; kmeans: online k-means variables
and EMA updates; model: the decoder-only LM; estimator: the T2T model `routing_transformer_mtf`
(TF2-compatible replacement for T2T's mtf_model glue).
"""
from routing_transformer.t2t import patches

patches.install(["tf_aliases"])  # mesh_tensorflow imports what TF 2.14 dropped
