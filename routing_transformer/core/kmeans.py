"""Online mini-batch k-means of the routing centroids (Roy et al., TACL 2021; the original
release's): assignments, losses, per-head statistics, EMA step, re-seeding, and one layer's
variables (`OnlineKMeans`: means [h, c, d], ema_count [h, c], ema_means [h, c, d]), shared by
queries and keys (one update per step). Also routing's LayerNorm without scale."""
import tensorflow as tf

LOW_PRECISION = (tf.bfloat16, tf.float16)
DECAY = 0.999
EPSILON = 1e-5
BETA = 1e-4
DEAD_FRACTION = 1e-3  # a cluster holding < this share of its uniform share counts as dead
# The original adds one clustering loss for the queries, one for the keys; routing reports the mean.
ROUTED_SETS = 2


def compute_dtype(dtype):
  """float32 for bfloat16 / float16 activations (normalisation, softmax, routing), else dtype."""
  dtype = tf.as_dtype(dtype).base_dtype
  return tf.float32 if dtype in LOW_PRECISION else dtype


def layer_norm_no_scale(x, epsilon=1e-6, dtype=None):
  """LayerNorm without scale or bias over the last axis, in `compute_dtype`, returned in `dtype`."""
  x = tf.convert_to_tensor(x)
  out_dtype = x.dtype.base_dtype if dtype is None else tf.as_dtype(dtype)
  x = tf.cast(x, compute_dtype(x.dtype))
  mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
  return tf.cast((x - mean) * tf.math.rsqrt(variance + epsilon), out_dtype)


def initial_means(heads, num_clusters, depth, seed=None):
  """LayerNorm (no scale) of N(0, 1) samples: [heads, num_clusters, depth] float32."""
  return layer_norm_no_scale(
      tf.random.normal([heads, num_clusters, depth], seed=seed, dtype=tf.float32))


def assignments(scores):
  """The best centroid of every position: scores [b, h, c, n] -> int32 [b, h, n]."""
  return tf.argmax(scores, axis=2, output_type=tf.int32)


def assigned_centroids(centroids, clusters):
  """mu[h, clusters[b, h, i]] for every position: [h, c, d], [b, h, n] -> [b, h, n, d]."""
  heads, num_clusters, depth = centroids.shape
  flat = tf.reshape(centroids, [heads * num_clusters, depth])
  offsets = tf.reshape(tf.range(heads) * num_clusters, [1, heads, 1])
  return tf.gather(flat, clusters + offsets)


def centroid_distance(x_hat, centroids, clusters, weights):
  """mean((x - mu[assigned])^2) over real positions, heads and depth (float32 scalar): x_hat
  [b, h, n, d], centroids [h, c, d], clusters int32 [b, h, n], weights [b, n] (0 at padding)."""
  x_hat = tf.cast(x_hat, compute_dtype(x_hat.dtype))
  mu = tf.cast(assigned_centroids(centroids, clusters), x_hat.dtype)
  squared = tf.reduce_sum(tf.cast(tf.square(x_hat - mu), tf.float32), axis=-1)  # [b, h, n]
  weights = tf.cast(weights, tf.float32)[:, tf.newaxis, :]
  total = tf.reduce_sum(weights) * x_hat.shape[1] * x_hat.shape[-1]
  return tf.reduce_sum(squared * weights) / tf.maximum(total, 1.0)


def commitment_loss(x_hat, centroids, clusters, weights):
  """mean((x - stop_gradient(mu[assigned]))^2): pulls the vectors towards their centroids."""
  return centroid_distance(x_hat, tf.stop_gradient(centroids), clusters, weights)


def codebook_loss(x_hat, centroids, clusters, weights):
  """mean((stop_gradient(x) - mu[assigned])^2): moves centroids by gradient when ema=False."""
  return centroid_distance(tf.stop_gradient(x_hat), centroids, clusters, weights)


def clustering_loss(commitment, beta, codebook=0.0):
  """A routing layer's k-means loss weighted as the original's: ROUTED_SETS * (beta * commitment
  + codebook), `commitment` and `codebook` the means over queries and keys."""
  return ROUTED_SETS * (beta * commitment + codebook)


def cluster_statistics(x_hat, clusters, num_clusters, weights, legacy_counts=False):
  """Per-head float32 (counts [h, c], sums [h, c, d]) of x_hat [b, h, n, d] by clusters int32
  [b, h, n], weights [b, n] (0 at padding); legacy_counts: `interleaved_counts`."""
  heads, depth = x_hat.shape[1], x_hat.shape[3]
  segments = clusters + tf.reshape(tf.range(heads) * num_clusters, [1, heads, 1])
  weights = tf.broadcast_to(tf.cast(weights, tf.float32)[:, tf.newaxis, :], tf.shape(clusters))
  if legacy_counts:
    counts = interleaved_counts(clusters, num_clusters, weights)
  else:
    counts = tf.reshape(tf.math.unsorted_segment_sum(weights, segments, heads * num_clusters),
                        [heads, num_clusters])
  sums = tf.math.unsorted_segment_sum(tf.cast(x_hat, tf.float32) * weights[..., tf.newaxis],
                                      segments, heads * num_clusters)
  return counts, tf.reshape(sums, [heads, num_clusters, depth])


def interleaved_counts(clusters, num_clusters, weights):
  """The original release's counts [h, c] (hparam `legacy_kmeans_counts`): one-hot [b, h, n, c]
  reshaped to [-1, h, c] and summed, so each head's counts mix all heads (same with one head)."""
  heads = clusters.shape[1]
  weights = tf.cast(weights, tf.float32)
  if weights.shape.rank == 2:
    weights = weights[:, tf.newaxis, :]
  one_hot = tf.one_hot(clusters, num_clusters, dtype=tf.float32) * weights[..., tf.newaxis]
  return tf.reduce_sum(tf.reshape(one_hot, [-1, heads, num_clusters]), axis=0)


def routed_vectors(aux, share_qk):
  """(x_hats, clusters) of a Routed or aux dict: the queries, and the keys without share_qk."""
  if share_qk:
    return [aux["q_hat"]], [aux["query_clusters"]]
  return [aux["q_hat"], aux["k_hat"]], [aux["query_clusters"], aux["key_clusters"]]


def combined_statistics(x_hats, clusters, num_clusters, weights, legacy_counts=False):
  """Sum of `cluster_statistics` over several vector sets (queries and keys): one update."""
  counts, sums = 0.0, 0.0
  for x_hat, assigned in zip(x_hats, clusters):
    c, s = cluster_statistics(x_hat, assigned, num_clusters, weights, legacy_counts)
    counts, sums = counts + c, sums + s
  return counts, sums


def ema_step(ema_count, ema_means, counts, sums, decay=DECAY):
  """One EMA step: x <- decay * x + (1 - decay) * batch value, for counts and sums."""
  new_count = decay * ema_count + (1.0 - decay) * counts
  new_means = decay * ema_means + (1.0 - decay) * sums
  return new_count, new_means


def smoothed_means(ema_count, ema_means, epsilon=EPSILON):
  """Centroids [h, c, d]: EMA sums [h, c, d] / `smoothed_count` of the EMA counts [h, c]."""
  return ema_means / smoothed_count(ema_count, epsilon)[..., tf.newaxis]


def smoothed_count(ema_count, epsilon=EPSILON):
  """Laplace-smoothed counts [h, c]: (count + eps) / (N + c * eps) * N, N = sum per head."""
  num_clusters = ema_count.shape[-1]
  total = tf.reduce_sum(ema_count, axis=-1, keepdims=True)
  return (ema_count + epsilon) / (total + num_clusters * epsilon) * total


def occupancy(counts):
  """Scalars of cluster sizes counts [h, c]: min/max share of a cluster, mean entropy (nats) of
  the per-head occupancy, number of dead clusters (share < DEAD_FRACTION / c)."""
  counts = tf.cast(counts, tf.float32)
  num_clusters = counts.shape[-1]
  share = counts / tf.maximum(tf.reduce_sum(counts, axis=-1, keepdims=True), 1e-9)
  entropy = -tf.reduce_sum(share * tf.math.log(tf.maximum(share, 1e-12)), axis=-1)
  return {
      "occupancy_min": tf.reduce_min(share),
      "occupancy_max": tf.reduce_max(share),
      "occupancy_entropy": tf.reduce_mean(entropy),
      "dead_clusters": tf.reduce_sum(tf.cast(share < DEAD_FRACTION / num_clusters, tf.float32)),
  }


def dead_mask(ema_count, fraction=DEAD_FRACTION):
  """bool [h, c]: clusters whose share of the EMA counts [h, c] is below fraction / c."""
  num_clusters = ema_count.shape[-1]
  share = ema_count / tf.maximum(tf.reduce_sum(ema_count, axis=-1, keepdims=True), 1e-9)
  return share < fraction / num_clusters


def reseed_candidates(x_hat, weights, num_clusters, seed=None):
  """[h, c, d]: per head, c vectors drawn from the real positions of x_hat [b, h, n, d]."""
  batch, heads, length, depth = x_hat.shape
  flat = tf.reshape(tf.transpose(x_hat, [1, 0, 2, 3]), [heads, batch * length, depth])
  real = tf.reshape(tf.cast(weights, tf.float32), [1, batch * length])
  logits = tf.tile(tf.math.log(tf.maximum(real, 1e-30)), [heads, 1])
  index = tf.random.categorical(logits, num_clusters, seed=seed)
  return tf.gather(flat, index, batch_dims=1)


def assign_ema_update(means, ema_count, ema_means, counts, sums, decay=DECAY, epsilon=EPSILON,
                      ema=True, candidates=None):
  """One EMA step (grouped op; None in eager mode): ema_count, ema_means <- EMA of counts [h, c],
  sums [h, c, d]; means <- `smoothed_means` (ema). Dead clusters take `candidates` [h, c, d]."""
  new_count, new_sums = ema_step(ema_count, ema_means, counts, sums, decay)
  new_means = smoothed_means(new_count, new_sums, epsilon)
  if candidates is not None:
    dead = dead_mask(new_count)[..., tf.newaxis]
    count = smoothed_count(new_count, epsilon)[..., tf.newaxis]
    new_means = tf.where(dead, candidates, new_means)
    new_sums = tf.where(dead, candidates * count, new_sums)
  ops = [ema_count.assign(new_count), ema_means.assign(new_sums)]
  if not ema:
    return tf.group(ops)
  with tf.control_dependencies(ops):
    op = means.assign(new_means)
  return tf.group(op)


class OnlineKMeans(object):
  """A routing layer's centroids (tf.compat.v1 variables) and their update; ema=False: trainable
  means learned by `codebook_loss`; legacy_counts: `interleaved_counts`."""

  def __init__(self, heads, num_clusters, depth, decay=DECAY, beta=BETA, epsilon=EPSILON,
               ema=True, legacy_counts=False, name="cluster_attention"):
    self.heads, self.num_clusters, self.depth = heads, num_clusters, depth
    self.decay, self.beta, self.epsilon, self.ema = decay, beta, epsilon, ema
    self.legacy_counts = legacy_counts
    with tf.compat.v1.variable_scope(name):
      init = initial_means(heads, num_clusters, depth)
      self.means = tf.compat.v1.get_variable("means", initializer=init, trainable=not ema)
      self.ema_count = tf.compat.v1.get_variable(
          "ema_count", initializer=tf.zeros([heads, num_clusters]), trainable=False)
      # The same initial tensor: the initializers run in one session.run, so ema_means == means.
      self.ema_means = tf.compat.v1.get_variable("ema_means", initializer=init, trainable=False)

  def statistics(self, x_hats, clusters, weights):
    """(counts [h, c], sums [h, c, d]) of one step's vector sets (`combined_statistics`)."""
    return combined_statistics(x_hats, clusters, self.num_clusters, weights, self.legacy_counts)

  def update(self, x_hats, clusters, weights, all_reduce=None):
    """(EMA update op, counts [h, c] before all_reduce) from lists of x_hats, clusters; all_reduce:
    optional fn on (counts, sums) across replicas."""
    counts, sums = self.statistics(x_hats, clusters, weights)
    if all_reduce is not None:
      return self.update_from_statistics(*all_reduce(counts, sums))[0], counts
    return self.update_from_statistics(counts, sums)

  def update_from_statistics(self, counts, sums, candidates=None):
    """(`assign_ema_update` op, counts) from counts [h, c], sums [h, c, d]."""
    op = assign_ema_update(self.means, self.ema_count, self.ema_means, counts, sums, self.decay,
                           self.epsilon, self.ema, candidates)
    return op, counts

  def loss(self, commitment, x_hats=(), clusters=(), weights=None):
    """`clustering_loss` of the commitment loss (and with ema=False the mean codebook loss)."""
    codebook = 0.0
    if not self.ema:
      for x_hat, assigned in zip(x_hats, clusters):
        codebook += codebook_loss(x_hat, self.means, assigned, weights) / len(x_hats)
    return clustering_loss(commitment, self.beta, codebook)


class KMeansStep(object):
  """What a routing layer hands to the model for the (shard-combined) centroid update."""

  def __init__(self, km, x_hats, clusters, weights, statistics=None):
    self.km, self.x_hats, self.clusters, self.weights = km, x_hats, clusters, weights
    # Scalars of routing.routing_statistics (the model writes them as TRAIN summaries).
    self.routing_statistics = statistics or {}

  def statistics(self):
    """(counts [h, c], sums [h, c, d]) of this shard."""
    return self.km.statistics(self.x_hats, self.clusters, self.weights)


def shard_update(steps, all_reduce=None, reseed=False):
  """(update op, counts [h, c]): one EMA update from the shards' KMeansSteps, averaged, then
  `all_reduce`d across replicas; reseed: dead clusters take the first shard's queries."""
  stats = [step.statistics() for step in steps]
  counts = tf.add_n([c for c, _ in stats]) / len(stats)
  sums = tf.add_n([s for _, s in stats]) / len(stats)
  if all_reduce is not None:
    counts, sums = all_reduce(counts, sums)
  first = steps[0]
  candidates = None
  if reseed:
    candidates = reseed_candidates(first.x_hats[0], first.weights, first.km.num_clusters)
  op, _ = first.km.update_from_statistics(counts, sums, candidates)
  return op, counts
