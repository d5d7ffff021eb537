"""The original release's routing rules that only its checkpoints need.

`causal_key_routing_attention` (hparam `legacy_causal_key_routing`, off in every set): causal
routing with separate keys (share_qk=False) as the original's utils.py computes it
(`clustered_local_attention_helper` with masked=True): the keys and values of cluster c are the
top-`window` positions of the *keys'* own centroid scores, not the query members, and the
window x window block is masked with the lower triangle on ranks (query rank i sees key ranks
j <= i, ranks in two different position lists), so a query may see keys after its position.
With share_qk (the released model) the two lists coincide and the rule is the paper's. The
converter (`routing_transformer/tools/checkpoints.py`, `legacy_note`) says when a checkpoint
needs it.
"""
import tensorflow as tf

from routing_transformer.core.attention import routing


def causal_key_routing_attention(q, k, v, centroids, window, padding=None, relative_keys=None,
                                 relative_values=None, random_routing=False, exclude_self=False,
                                 logit_scale=None, dropout_rate=0.0, padding_as_original=False,
                                 recompute=False):
  """Causal routing attention with keys routed by their own scores (the original's rule).

  Args and returns as `routing.routing_attention` with causal=True, share_qk=False; aux
  "key_indices" are the keys' own top-w positions.
  """
  q_hat, k_hat, v, mu, pad, rel_k, rel_v = routing.normalised_inputs(
      q, k, v, centroids, window, False, padding, relative_keys, relative_values,
      "routing_attention")
  key_pad, member_pad, kmeans_pad = routing.padding_roles(pad, True, padding_as_original)
  aux = routing.route(q_hat, k_hat, mu, window, share_qk=False, route_keys=True,
                      member_padding=member_pad,
                      weights=routing.position_weights(kmeans_pad, tf.shape(q_hat)[0],
                                                       q_hat.shape[2]),
                      random_routing=random_routing, with_loss=not recompute)
  return routing.attend_in_clusters(aux, q, k, v, mu, window, True, False, key_pad, rel_k,
                                    rel_v, exclude_self, logit_scale, dropout_rate, recompute)


def routing_attention(q, k, v, centroids, window, causal=True, share_qk=True, padding=None,
                      relative_keys=None, relative_values=None, random_routing=False,
                      exclude_self=False, logit_scale=None, legacy_causal_key_routing=False,
                      dropout_rate=0.0, padding_as_original=False, recompute=False):
  """`routing.routing_attention` with the switch `legacy_causal_key_routing` (the package's
  `attention.routing_attention`): on, causal, with separate keys, the original's rule
  (`causal_key_routing_attention`); otherwise the paper's routing, argument for argument."""
  if legacy_causal_key_routing and causal and not share_qk:
    return causal_key_routing_attention(
        q, k, v, centroids, window, padding, relative_keys, relative_values, random_routing,
        exclude_self, logit_scale, dropout_rate, padding_as_original, recompute)
  return routing.routing_attention(
      q, k, v, centroids, window, causal, share_qk, padding, relative_keys, relative_values,
      random_routing, exclude_self, logit_scale, dropout_rate, padding_as_original, recompute)
