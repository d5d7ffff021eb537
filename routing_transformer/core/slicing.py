"""One slice along one axis, shared by the attention functions and the grouped recomputation
(`recompute.recompute_in_groups`) without either importing the other."""
import tensorflow as tf


def slice_axis(x, axis, start, size):
  """x[..., start:start + size, ...] along `axis` as tf.slice: its gradient is one Pad, where a
  strided slice's (StridedSliceGrad) is several times slower on CPU for large tensors."""
  rank = x.shape.rank
  axis %= rank
  begin, sizes = [0] * rank, [-1] * rank
  begin[axis], sizes[axis] = start, size
  return tf.slice(x, begin, sizes)
