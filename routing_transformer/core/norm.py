"""LayerNorm without scale or bias: how routing normalises queries, keys and initial centroids.

Its own module so that both the attention functions (`attention.common` re-exports it) and the
k-means (`kmeans.initial_means`) use it without the k-means importing the attention package.
Also the rule for low-precision activations (hparam `activation_dtype`): normalisations,
softmaxes, routing scores and k-means statistics are computed in `compute_dtype` of the
activations' dtype, float32 for bfloat16 / float16.
"""
import tensorflow as tf

from routing_transformer.core import rebuild

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


def layer_norm(x, scale, bias, epsilon=1e-6):
  """LayerNorm with scale and bias over the last axis, T2T's `layer_norm_compute` (the same ops,
  so the same values), whose backward pass keeps only x.

  The plain ops keep x - mean and the normalised x ([..., d] each) for their gradients; here the
  backward pass recomputes them from x once the incoming gradient exists (a control dependency:
  without it the executor would run the recomputation in the forward pass and keep it) and
  differentiates the same ops: alone, the gradients are the plain ops' bit for bit (in a larger
  graph TF's graph rewrites may round them apart, ~1e-7 relative). The output is
  `rebuild.rebuildable` from x: the dense layers and the GEGLU block reading it rebuild it for
  their kernel gradients, so no norm's output is kept either.

  Args:
    x: [..., d] float tensor.
    scale, bias: [d] (cast to x's dtype, as T2T does).
    epsilon: added to the variance.
  Returns:
    [..., d] tensor of x's dtype.
  """
  x = tf.convert_to_tensor(x)
  scale, bias = [tf.cast(tf.convert_to_tensor(t), x.dtype) for t in (scale, bias)]

  def compute(x, scale, bias):
    mean = tf.reduce_mean(x, axis=[-1], keepdims=True)
    variance = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=[-1], keepdims=True)
    norm_x = (x - mean) * tf.math.rsqrt(variance + tf.cast(epsilon, x.dtype))
    return norm_x * scale + bias

  @tf.custom_gradient
  def norm(x, scale, bias):
    def grad(dy):
      inputs = rebuild.after(dy, x, scale, bias)
      return tf.gradients(compute(*inputs), inputs, dy)
    return compute(x, scale, bias), grad

  return rebuild.rebuildable(norm(x, scale, bias), compute, x, scale, bias)
