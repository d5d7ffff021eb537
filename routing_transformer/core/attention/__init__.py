"""Pure functional attention: full (dense baseline), blocked local, and routing attention.

No variables inside; every function works in eager and graph mode and compiles with XLA.
"""
from routing_transformer.core.attention.causal_window import causal_window_attention
from routing_transformer.core.attention.common import layer_norm_no_scale
from routing_transformer.core.attention.full import full_attention
from routing_transformer.core.attention.local import local_attention
from routing_transformer.core.attention.routing import routing_attention

__all__ = ["causal_window_attention", "full_attention", "layer_norm_no_scale", "local_attention",
           "routing_attention"]
