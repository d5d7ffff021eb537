"""NumPy dense references: every attention kind as a softmax over an explicit [n, n] allowed set.

Deliberately written differently from the TensorFlow code (no blocks, no gather/scatter): each
kind builds the full matrix of logits and the boolean matrix of allowed (query, key) pairs.
"""
import numpy as np

COUNT_EPSILON = 1e-2


def layer_norm(x, epsilon=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + epsilon)


def softmax_allowed(logits, allowed):
  """Row softmax over exactly the allowed entries; rows with none allowed are 0."""
  out = np.zeros_like(logits)
  for i in range(logits.shape[0]):
    idx = np.nonzero(allowed[i])[0]
    if idx.size:
      z = logits[i, idx] - logits[i, idx].max()
      e = np.exp(z)
      out[i, idx] = e / e.sum()
  return out


def relative_index(distance, table):
  radius = (table.shape[0] - 1) // 2
  return np.clip(distance, -radius, radius) + radius


def attend(q, k, v, allowed, rel_distance=None, rel_k=None, rel_v=None):
  """Dense attention of one head: q [n, d], k/v [m, d], allowed [n, m], rel_distance [n, m]."""
  logits = q @ k.T
  if rel_k is not None:
    table = rel_k[relative_index(rel_distance, rel_k)]  # [n, m, d]
    logits = logits + np.einsum("id,ijd->ij", q, table)
  probs = softmax_allowed(logits, allowed)
  out = probs @ v
  if rel_v is not None:
    table = rel_v[relative_index(rel_distance, rel_v)]
    out = out + np.einsum("ij,ijd->id", probs, table)
  return out


def _pad_mask(padding, b, n):
  return np.zeros(n, bool) if padding is None else np.asarray(padding[b]).astype(bool)


def full(q, k, v, causal=True, padding=None, scale=None):
  bsz, heads, n, d = q.shape
  m = k.shape[2]
  scale = d ** -0.5 if scale is None else scale
  out = np.zeros(q.shape[:3] + (v.shape[-1],))
  for b in range(bsz):
    allowed = np.ones((n, m), bool) & ~_pad_mask(padding, b, m)[None, :]
    if causal:
      allowed &= np.tri(n, m, dtype=bool)
    for h in range(heads):
      out[b, h] = attend(q[b, h] * scale, k[b, h], v[b, h], allowed)
  return out


def local_pattern(n, block_length, flange, causal=True):
  """Blocked local attention as a dense pattern: (allowed [n, n], distance j - i [n, n])."""
  i = np.arange(n)[:, None]
  j = np.arange(n)[None, :]
  bi, bj = i // block_length, j // block_length
  reach = flange // block_length
  if causal:
    window = (bj >= bi - reach) & (bj <= bi) & (j <= i)
  else:
    window = np.abs(bj - bi) <= reach
  return window, j - i


def local(q, k, v, block_length, flange, causal=True, rel_k=None, rel_v=None, padding=None,
          scale=None):
  bsz, heads, n, d = q.shape
  scale = d ** -0.5 if scale is None else scale
  window, distance = local_pattern(n, block_length, flange, causal)
  out = np.zeros(q.shape[:3] + (v.shape[-1],))
  for b in range(bsz):
    allowed = window & ~_pad_mask(padding, b, n)[None, :]
    for h in range(heads):
      out[b, h] = attend(q[b, h] * scale, k[b, h], v[b, h], allowed, distance, rel_k, rel_v)
  return out


def members(scores, window, pad):
  """Top-`window` positions of one centroid's scores (padding last), ascending."""
  scores = np.where(pad, -np.inf, scores)
  order = np.argsort(-scores, kind="stable")
  return np.sort(order[:window])


def without_self(allowed):
  """Extension routing_exclude_self: drop (i, i) from rows that allow another key."""
  allowed = allowed.copy()
  n = min(allowed.shape)
  others = allowed.copy()
  others[np.arange(n), np.arange(n)] = False
  rows = others.any(axis=1)
  allowed[rows] = others[rows]
  return allowed


def head_scales(logit_scale, heads):
  """Per-head logit multipliers of the extension routing_logit_scale (1 = the paper)."""
  return np.broadcast_to(np.asarray(1.0 if logit_scale is None else logit_scale,
                                    np.float64), [heads])


def routing_pattern(q_hat, k_hat, mu, window, causal=True, share_qk=True, pad=None,
                    padding_as_original=False):
  """One (batch, head) of routing attention as dense per-centroid patterns.

  q_hat, k_hat [n, d] normalised, mu [c, d], pad bool [n] or None. padding_as_original: the
  original release's padding (members chosen as if nothing were padding; padding keys masked
  only in non-causal attention). Returns [(in_q [n], allowed [n, n], rank distance [n, n])], one
  per centroid: the cluster's query members, the (query, key) pairs it allows, key rank - query
  rank inside the sorted cluster.
  """
  n = q_hat.shape[0]
  pad = np.zeros(n, bool) if pad is None else pad
  member_pad = np.zeros(n, bool) if padding_as_original else pad
  key_pad = np.zeros(n, bool) if padding_as_original and causal else pad
  sq = mu @ q_hat.T  # [c, n]
  sk = mu @ k_hat.T
  patterns = []
  for c in range(mu.shape[0]):
    q_members = members(sq[c], window, member_pad)
    k_members = q_members if (causal or share_qk) else members(sk[c], window, member_pad)
    in_q = np.zeros(n, bool)
    in_q[q_members] = True
    in_k = np.zeros(n, bool)
    in_k[k_members] = True
    rank_q = np.full(n, -10 ** 6)
    rank_q[q_members] = np.arange(window)
    rank_k = np.full(n, -10 ** 6)
    rank_k[k_members] = np.arange(window)
    allowed = in_q[:, None] & in_k[None, :] & ~key_pad[None, :]
    if causal:
      allowed &= np.tri(n, n, dtype=bool)
    patterns.append((in_q, allowed, rank_k[None, :] - rank_q[:, None]))
  return patterns


def routing(q, k, v, centroids, window, causal=True, share_qk=True, padding=None, rel_k=None,
            rel_v=None, exclude_self=False, logit_scale=None, padding_as_original=False):
  """Routing attention; returns (output, query_clusters, commitment_loss)."""
  bsz, heads, n, _ = q.shape
  q_hat = layer_norm(q)
  k_hat = q_hat if share_qk else layer_norm(k)
  scales = head_scales(logit_scale, heads)
  out = np.zeros(q.shape[:3] + (v.shape[-1],))
  clusters = np.zeros((bsz, heads, n), np.int64)
  sq_err, count_err = 0.0, 0
  for b in range(bsz):
    pad = _pad_mask(padding, b, n)
    loss_pad = np.zeros(n, bool) if padding_as_original else pad
    for h in range(heads):
      mu = centroids[h]
      sq = mu @ q_hat[b, h].T  # [c, n]
      sk = mu @ k_hat[b, h].T
      clusters[b, h] = sq.argmax(0)
      terms = [(q_hat, sq)] + ([] if share_qk else [(k_hat, sk)])
      for x, s in terms:
        diff = x[b, h] - mu[s.argmax(0)]
        sq_err += (diff[~loss_pad] ** 2).sum() / len(terms)
        count_err += (~loss_pad).sum() * x.shape[-1] / len(terms)
      total = np.zeros((n, v.shape[-1]))
      count = np.zeros(n)
      for in_q, allowed, rank_distance in routing_pattern(
          q_hat[b, h], k_hat[b, h], mu, window, causal, share_qk, pad, padding_as_original):
        if exclude_self:
          allowed = without_self(allowed)
        o = attend(q_hat[b, h] * scales[h], k_hat[b, h], v[b, h], allowed, rank_distance, rel_k,
                   rel_v)
        total[in_q] += o[in_q]
        count[in_q] += 1
      out[b, h] = total / (count[:, None] + COUNT_EPSILON)
  return out, clusters, sq_err / max(count_err, 1)


def causal_window_pattern(clusters, window):
  """Strictly causal routing of one (batch, head) with assignments `clusters` [n] as a dense
  pattern: (allowed [n, n]: the last `window` positions j <= i of i's cluster, distance [n, n]:
  j's index in the cluster's order minus i's)."""
  a = clusters
  n = len(a)
  rank = np.zeros(n, np.int64)  # index of each position within its cluster
  for i in range(n):
    rank[i] = (a[:i] == a[i]).sum()
  allowed = np.zeros((n, n), bool)
  for i in range(n):
    same = [j for j in range(i + 1) if a[j] == a[i]][-window:]
    allowed[i, same] = True
  return allowed, rank[None, :] - rank[:, None]


def causal_window(q, k, v, centroids, window, share_qk=True, padding=None, rel_k=None,
                  rel_v=None, exclude_self=False, logit_scale=None):
  """Strictly causal routing: query i attends to the last `window` positions j <= i of its
  argmax cluster (itself included); returns (output, clusters)."""
  bsz, heads, n, _ = q.shape
  q_hat = layer_norm(q)
  k_hat = q_hat if share_qk else layer_norm(k)
  scales = head_scales(logit_scale, heads)
  out = np.zeros(q.shape[:3] + (v.shape[-1],))
  clusters = np.zeros((bsz, heads, n), np.int64)
  for b in range(bsz):
    pad = _pad_mask(padding, b, n)
    for h in range(heads):
      a = (centroids[h] @ q_hat[b, h].T).argmax(0)
      clusters[b, h] = a
      allowed, distance = causal_window_pattern(a, window)
      allowed &= ~pad[None, :]
      if exclude_self:
        allowed = without_self(allowed)
      out[b, h] = attend(q_hat[b, h] * scales[h], k_hat[b, h], v[b, h], allowed, distance, rel_k,
                         rel_v)
  return out, clusters


def original_causal_routing(q, k, v, centroids, window, rel_k=None, rel_v=None):
  """The original release's causal routing with separate keys (share_qk=False), as its utils.py
  computes it (clustered_local_attention_helper with masked=True, no padding): per centroid, the
  query list is the top-`window` positions by the queries' scores and the key/value list the
  top-`window` positions by the keys' own scores, each sorted ascending; the window x window
  block is masked with the lower triangle on ranks (query rank i sees key ranks j <= i, whatever
  the positions), relative distances are rank distances, and outputs are summed back onto the
  query positions divided by (count + 1e-2). Returns [b, h, n, d]."""
  bsz, heads, n, _ = q.shape
  q_hat, k_hat = layer_norm(q), layer_norm(k)
  out = np.zeros(q.shape[:3] + (v.shape[-1],))
  ranks = np.arange(window)
  distance = ranks[None, :] - ranks[:, None]  # key rank - query rank
  below = np.tri(window, window, dtype=bool)  # attention_bias_lower_triangle
  for b in range(bsz):
    for h in range(heads):
      dist_q = -(q_hat[b, h] @ centroids[h].T)  # [n, c]: the original's "distances"
      dist_k = -(k_hat[b, h] @ centroids[h].T)
      total = np.zeros((n, v.shape[-1]))
      count = np.zeros(n)
      for c in range(centroids.shape[1]):
        q_idx = np.sort(np.argsort(dist_q[:, c], kind="stable")[:window])  # top_k(-dist)
        k_idx = np.sort(np.argsort(dist_k[:, c], kind="stable")[:window])
        o = attend(q_hat[b, h, q_idx], k_hat[b, h, k_idx], v[b, h, k_idx], below, distance,
                   rel_k, rel_v)
        total[q_idx] += o
        count[q_idx] += 1
      out[b, h] = total / (count[:, None] + COUNT_EPSILON)
  return out
