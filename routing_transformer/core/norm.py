"""LayerNorm without scale or bias: how routing normalises queries, keys and initial centroids.

Its own module so that both the attention functions (`attention.common` re-exports it) and the
k-means (`kmeans.initial_means`) use it without the k-means importing the attention package.
"""
import tensorflow as tf


def layer_norm_no_scale(x, epsilon=1e-6):
  """LayerNorm with scale and bias disabled over the last axis: mean 0, variance 1.

  Args:
    x: [..., d] float tensor.
    epsilon: added to the variance.
  Returns:
    [..., d] tensor of x's dtype.
  """
  mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
  return (x - mean) * tf.math.rsqrt(variance + epsilon)
