"""LayerNorm without scale or bias: how routing normalises queries, keys and initial centroids.

Its own module so that both the attention functions (`attention.common` re-exports it) and the
k-means (`kmeans.initial_means`) use it without the k-means importing the attention package.
Also the rule for low-precision activations (hparam `activation_dtype`): normalisations,
softmaxes, routing scores and k-means statistics are computed in `compute_dtype` of the
activations' dtype, float32 for bfloat16 / float16.
"""
import tensorflow as tf

LOW_PRECISION = (tf.bfloat16, tf.float16)


def compute_dtype(dtype):
  """The dtype to normalise, take softmaxes and route in for activations of `dtype`: float32
  for bfloat16 / float16, else `dtype` itself (float32, float64)."""
  dtype = tf.as_dtype(dtype).base_dtype
  return tf.float32 if dtype in LOW_PRECISION else dtype


def layer_norm_no_scale(x, epsilon=1e-6, dtype=None):
  """LayerNorm with scale and bias disabled over the last axis: mean 0, variance 1.

  Computed in `compute_dtype(x.dtype)` (float32 for bfloat16 x).

  Args:
    x: [..., d] float tensor.
    epsilon: added to the variance.
    dtype: the result's dtype; default x's dtype.
  Returns:
    [..., d] tensor of `dtype`.
  """
  x = tf.convert_to_tensor(x)
  out_dtype = x.dtype.base_dtype if dtype is None else tf.as_dtype(dtype)
  x = tf.cast(x, compute_dtype(x.dtype))
  mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
  return tf.cast((x - mean) * tf.math.rsqrt(variance + epsilon), out_dtype)
