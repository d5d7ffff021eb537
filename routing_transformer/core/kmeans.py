"""Online mini-batch k-means that learns the routing centroids (Roy et al., TACL
2021; the original release's k-means): all of it.

- assignments and losses: `assignments` (argmax centroid), `commitment_loss`, `codebook_loss`,
  `clustering_loss` (the weight: the original's query term plus key term);
- statistics and the EMA step: `cluster_statistics` (per head, or with `legacy_counts` the
  original release's interleaved counts), `combined_statistics`, `ema_step`, `smoothed_means`;
- monitoring and re-seeding: `occupancy`, `dead_mask`, `reseed_candidates`;
- variables and the per-step update op: `OnlineKMeans`, `assign_ema_update`, `KMeansStep` (what a
  routing layer hands to the model) and `shard_update` (one update from every data-parallel
  shard).

`OnlineKMeans` owns one routing layer's variables in tf.compat.v1 graph mode, the way T2T builds
models:
  means      [h, c, d]  centroids used for routing (init LayerNorm-without-scale of N(0, 1))
  ema_count  [h, c]     EMA of cluster sizes (init 0), non-trainable
  ema_means  [h, c, d]  EMA of cluster sums (init = means), non-trainable
Queries and keys of a layer share the centroids and are combined into one update per step.
The attention functions (`attention.routing`, `attention.causal_window`) call `assignments` and
`commitment_loss`; this module imports nothing from the attention package.
"""
import tensorflow as tf

from routing_transformer.core import norm

DECAY = 0.999
EPSILON = 1e-5
BETA = 1e-4
DEAD_FRACTION = 1e-3  # a cluster holding < this share of its uniform share counts as dead
# The original adds one clustering loss for the queries and one for the keys (the same term twice
# with share_qk); the routing functions report the mean over the two.
ROUTED_SETS = 2


def initial_means(heads, num_clusters, depth, seed=None):
  """LayerNorm (no scale) of N(0, 1) samples: [heads, num_clusters, depth] float32."""
  return norm.layer_norm_no_scale(
      tf.random.normal([heads, num_clusters, depth], seed=seed, dtype=tf.float32))


def assignments(scores):
  """Hard k-means assignment: the best centroid of every position.

  Args:
    scores: [b, h, c, n] centroid scores mu_c . x_i (`attention.routing.centroid_scores`).
  Returns:
    int32 [b, h, n].
  """
  return tf.argmax(scores, axis=2, output_type=tf.int32)


def assigned_centroids(centroids, clusters):
  """mu[h, clusters[b, h, i]] for every position: [h, c, d], [b, h, n] -> [b, h, n, d]."""
  heads, num_clusters, depth = centroids.shape
  flat = tf.reshape(centroids, [heads * num_clusters, depth])
  offsets = tf.reshape(tf.range(heads) * num_clusters, [1, heads, 1])
  return tf.gather(flat, clusters + offsets)


def centroid_distance(x_hat, centroids, clusters, weights):
  """mean((x - mu[assigned])^2) over real positions, heads and depth.

  Args:
    x_hat: [b, h, n, d].
    centroids: [h, c, d].
    clusters: int32 [b, h, n] assignments.
    weights: [b, n], 1 for real positions and 0 for padding.
  Returns:
    float32 scalar (computed in float32 for bfloat16 x_hat).
  """
  x_hat = tf.cast(x_hat, norm.compute_dtype(x_hat.dtype))
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
  """A routing layer's k-means loss, weighted as the original release weights it.

  The original adds beta * commitment (+ codebook, without EMA) once for the queries and once for
  the keys, the keys being the queries with share_qk: 2 * beta * e_q with share_qk, beta *
  (e_q + e_k) with separate keys. `commitment` (and `codebook`) are means over the routed vector
  sets, as the routing functions report them (aux "commitment_loss"), so the loss is
  ROUTED_SETS times their weighted sum.

  Args:
    commitment: scalar, the mean commitment loss of the queries (and keys).
    beta: the commitment weight (hparam `beta`).
    codebook: scalar, the mean codebook loss (ema=False), or 0.
  Returns:
    scalar.
  """
  return ROUTED_SETS * (beta * commitment + codebook)


def cluster_statistics(x_hat, clusters, num_clusters, weights, legacy_counts=False):
  """Per-head cluster sizes and sums of one batch.

  Args:
    x_hat: [b, h, n, d] normalised vectors.
    clusters: int32 [b, h, n] assignments.
    num_clusters: c.
    weights: [b, n], 1 for real positions and 0 for padding (padding adds nothing).
    legacy_counts: the original release's counts (`interleaved_counts`) instead of per-head ones;
      the sums stay per head, as in the original.
  Returns:
    (counts float32 [h, c], sums float32 [h, c, d]).
  """
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
  """The original release's k-means counts with several heads (hparam `legacy_kmeans_counts`).

  Its online_kmeans reshapes the one-hot assignments [b, h, n, c] to [-1, h, c] before summing
  over the first axis, so count row j sums the one-hot rows whose flat index (b * h + h') * n + i
  is j modulo h: when h divides n, the positions i = j mod h of every head h'. Each head's
  counts mix all heads (a defect of the original; identical to per-head counts with one head).

  Args:
    clusters: int32 [b, h, n] assignments.
    num_clusters: c.
    weights: [b, n] or [b, h, n], 1 for real positions and 0 for padding.
  Returns:
    float32 [h, c].
  """
  heads = clusters.shape[1]
  weights = tf.cast(weights, tf.float32)
  if weights.shape.rank == 2:
    weights = weights[:, tf.newaxis, :]
  one_hot = tf.one_hot(clusters, num_clusters, dtype=tf.float32) * weights[..., tf.newaxis]
  return tf.reduce_sum(tf.reshape(one_hot, [-1, heads, num_clusters]), axis=0)


def routed_vectors(aux, share_qk):
  """(x_hats, clusters) the centroids learn from, out of a routing attention's aux dict: the
  queries, and the keys too when they are routed separately (share_qk=False)."""
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
  """Centroids from EMA statistics with Laplace smoothing of the counts.

  count <- (count + eps) / (N + c * eps) * N with N = sum of counts per head; means = sums / count.

  Args:
    ema_count: [h, c].
    ema_means: [h, c, d] (EMA of sums).
  Returns:
    [h, c, d].
  """
  return ema_means / smoothed_count(ema_count, epsilon)[..., tf.newaxis]


def smoothed_count(ema_count, epsilon=EPSILON):
  """Laplace-smoothed counts [h, c]: (count + eps) / (N + c * eps) * N, N = sum per head."""
  num_clusters = ema_count.shape[-1]
  total = tf.reduce_sum(ema_count, axis=-1, keepdims=True)
  return (ema_count + epsilon) / (total + num_clusters * epsilon) * total


def occupancy(counts):
  """Summary statistics of cluster sizes.

  Args:
    counts: [h, c] cluster sizes of one batch (or their EMA).
  Returns:
    dict of float32 scalars: min/max share of a cluster, mean entropy (nats, max log c) of the
    per-head occupancy distribution, and the number of dead clusters (share < DEAD_FRACTION / c).
  """
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
  """[h, c, d]: for every head, c vectors drawn at random from the real (non-padding)
  positions of x_hat [b, h, n, d] (weights [b, n]); the re-seeding values of dead clusters."""
  batch, heads, length, depth = x_hat.shape
  flat = tf.reshape(tf.transpose(x_hat, [1, 0, 2, 3]), [heads, batch * length, depth])
  real = tf.reshape(tf.cast(weights, tf.float32), [1, batch * length])
  logits = tf.tile(tf.math.log(tf.maximum(real, 1e-30)), [heads, 1])
  index = tf.random.categorical(logits, num_clusters, seed=seed)
  return tf.gather(flat, index, batch_dims=1)


def assign_ema_update(means, ema_count, ema_means, counts, sums, decay=DECAY, epsilon=EPSILON,
                      ema=True, candidates=None):
  """Assigns one EMA step to a layer's k-means variables (graph op, or done at once in eager).

  ema_count <- EMA of counts [h, c]; ema_means <- EMA of sums [h, c, d]; then (ema=True)
  means <- `smoothed_means`. With `candidates` [h, c, d] (see `reseed_candidates`), clusters dead
  after the step (`dead_mask` of the new EMA counts) take their candidate as centroid, their EMA
  sums set so the smoothed mean is exactly the candidate (counts kept). With ema=False only the
  EMA statistics move (monitoring); the trainable means are left to the codebook loss.
  Returns the grouped update op (None in eager mode).
  """
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
  """The centroids of one routing layer and their update (tf.compat.v1 variables).

  Build inside the layer's variable scope; T2T's scope reuse then shares the variables between
  data-parallel shards. With `ema=False` the means are trainable and learned by `codebook_loss`.
  With `legacy_counts` the statistics use the original release's counts (`interleaved_counts`).
  """

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
    """EMA update from this step's assignments (call in TRAIN mode only).

    Args:
      x_hats: list of [b, h, n, d] normalised vectors (queries, and keys when not shared).
      clusters: matching list of int32 [b, h, n] assignments.
      weights: [b, n], 1 for real positions and 0 for padding.
      all_reduce: optional fn applied to (counts, sums) to combine replicas/shards, e.g.
        TPU cross_replica_sum; every replica must end with identical centroids.
    Returns:
      (update op, counts [h, c] of this step before all-reduce).
    """
    counts, sums = self.statistics(x_hats, clusters, weights)
    if all_reduce is not None:
      return self.update_from_statistics(*all_reduce(counts, sums))[0], counts
    return self.update_from_statistics(counts, sums)

  def update_from_statistics(self, counts, sums, candidates=None):
    """EMA step from combined statistics: counts [h, c], sums [h, c, d]; returns (op, counts).

    See `assign_ema_update` (re-seeding with `candidates` [h, c, d]; ema=False).
    """
    op = assign_ema_update(self.means, self.ema_count, self.ema_means, counts, sums, self.decay,
                           self.epsilon, self.ema, candidates)
    return op, counts

  def loss(self, commitment, x_hats=(), clusters=(), weights=None):
    """`clustering_loss` of the mean commitment loss; with ema=False also of the mean codebook
    loss of (x_hats, clusters)."""
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
  """One EMA update of a layer's centroids from its `KMeansStep`s on every data-parallel shard.

  The shards' statistics are averaged, then combined across replicas by `all_reduce` (e.g. TPU
  cross_replica_sum), so every shard and replica keeps identical centroids.

  Args:
    steps: list of KMeansStep of one layer (one per shard, sharing the layer's OnlineKMeans).
    all_reduce: optional fn (counts, sums) -> (counts, sums) across replicas.
    reseed: dead clusters take vectors drawn from the first shard's queries
      (`reseed_candidates`, see `assign_ema_update`).
  Returns:
    (update op, counts [h, c] after all_reduce).
  """
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
