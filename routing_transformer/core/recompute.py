"""Rematerialisation of one residual block (hparam `recompute_layers`, tf.compat.v1 graphs) and
of one pure function (`recompute_function`: the routing heads' cluster attention, hparam
`recompute_attention`), or of one over groups of slices run one after another
(`recompute_in_groups`: the local heads' attention, a group of heads at a time).

`recompute_block(fn, inputs, substitutes)` runs fn(*inputs) -> (y, loss) once in the forward
pass and keeps only its inputs: the backward pass re-runs fn (in the same variable scope, with
reuse) after the gradient of y has arrived and differentiates the re-run. So a block's activations
live only while its gradient is computed, and the training step holds the block inputs (the
checkpoints) plus one block's activations.

What must not happen twice is left to the caller: fn is called with replay=False in the forward and
replay=True in the backward; the forward alone registers the k-means statistics (so the EMA
centroid update is built once, from the forward's assignments), and the replay reads the
centroids through `substitutes`: tensors read in the forward, so the re-run routes with the
centroids of the forward even though the EMA update assigned new ones in between.

Randomness is not replayed (a dropout mask or random routing would be drawn again), so the model
refuses recompute_layers with dropout inside the blocks or random_routing.
"""
import tensorflow as tf

from routing_transformer.core import rebuild
from routing_transformer.core import slicing

tf1 = tf.compat.v1


def _add(a, b):
  if a is None:
    return b
  if b is None:
    return a
  return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def _zeros_for_none(outputs, grads):
  """The incoming gradients of `outputs`, zeros where one is None: tf.gradients would read a None
  grad_ys as ones."""
  return [tf.zeros_like(t) if d is None else d for t, d in zip(outputs, grads)]


def recompute_block(fn, inputs, substitutes=None):
  """y, loss = fn(*inputs), recomputed in the backward pass.

  Args:
    fn: (*inputs, replay=bool) -> (y, loss): y a tensor or a tuple of tensors, loss a scalar
      tensor; creates/reuses variables with tf.compat.v1.get_variable in the current variable
      scope.
    inputs: list of float tensors (the block input, and e.g. the encoder output); gradients
      reach them only through the outputs of fn.
    substitutes: optional callable returning {variable.ref(): tensor}: variables fn reads
      through these tensors when replaying (their gradient is the gradient of the tensor).
  Returns:
    (y, loss) of the forward call.
  """
  scope = tf1.get_variable_scope()
  several = []  # whether fn's y is a tuple (set by the forward call)

  def outputs(y):
    return list(y) if isinstance(y, (tuple, list)) else [y]

  @tf.custom_gradient
  def block(*args):
    y, loss = fn(*args, replay=False)
    several.append(isinstance(y, (tuple, list)))
    ys = outputs(y)

    def grad(*grad_ys, variables=None):
      dys = _zeros_for_none(ys + [loss], grad_ys)
      # Re-run only once the gradient got here, from inputs the gradients stop at: a variable fn
      # reads may also lie upstream of an input (another unit's output, whose own custom
      # gradient accounts for it), and tf.gradients would follow that path too.
      with tf.control_dependencies(dys):
        replay_inputs = [tf.stop_gradient(t) for t in args]
      with tf1.variable_scope(scope, reuse=True), tf.name_scope("recompute"), rebuild.off():
        y2, loss2 = fn(*replay_inputs, replay=True)
      variables = list(variables or [])
      subs = substitutes() if substitutes is not None else {}
      sub_tensors = [subs.get(v.ref()) for v in variables]
      extra = [t for t in sub_tensors if t is not None]
      grads = tf.gradients(outputs(y2) + [loss2], replay_inputs + variables + extra, dys)
      input_grads = grads[:len(args)]
      var_grads = grads[len(args):len(args) + len(variables)]
      extra_grads = iter(grads[len(args) + len(variables):])
      var_grads = [g if t is None else _add(g, next(extra_grads))
                   for g, t in zip(var_grads, sub_tensors)]
      return input_grads, var_grads

    return tuple(ys) + (loss,), grad

  results = block(*inputs)
  ys, loss = list(results[:-1]), results[-1]
  return (tuple(ys) if several[0] else ys[0]), loss


def refuse_dropout(dropout_rate, name):
  """Attention dropout cannot be recomputed (a re-run would draw a new mask): ValueError."""
  if dropout_rate:
    raise ValueError(
        "%s: recompute_attention re-runs the attention in the backward pass and would draw its "
        "dropout mask again; set attention_dropout=0 or recompute_attention=False" % name)


def _present(tensors):
  """(indices of the entries of `tensors` that are not None, fill) where fill(values) is
  `tensors` with those entries replaced by `values` in order (the Nones kept)."""
  present = [i for i, t in enumerate(tensors) if t is not None]

  def fill(values):
    full = list(tensors)
    for i, t in zip(present, values):
      full[i] = t
    return full

  return present, fill


def recompute_function(fn, *tensors, differentiable=1):
  """fn(*tensors), keeping only `tensors` for the backward pass: the backward pass re-runs fn on
  them once the outputs' gradients have arrived and differentiates the re-run.

  fn must be pure (no variables, no random numbers, deterministic), so the re-run computes the
  forward's values and the gradients equal those of fn itself. Entries of `tensors` may be None
  (passed on to fn as None, no gradient); tensors fn reads from outside (e.g. member indices, a
  padding mask) get no gradient. fn returns one tensor y, or a tuple whose first
  `differentiable` entries carry gradients and whose other entries are side outputs
  (diagnostics: the forward's values, no gradient). The whole re-run waits for the gradients,
  also its ops that read only tensors from outside: they would otherwise run in the forward
  pass and be kept.
  Returns fn's outputs.
  """
  present, fill = _present(tensors)

  def call(args):
    """fn's outputs as a list, and whether fn returned a tuple."""
    outputs = fn(*fill(args))
    several = isinstance(outputs, tuple)
    return (list(outputs) if several else [outputs]), several

  @tf.custom_gradient
  def recomputed(*args):
    outputs, several = call(args)
    outputs = outputs[:differentiable] + [tf.stop_gradient(t) for t in outputs[differentiable:]]

    def grad(*dys):  # the side outputs' gradients are dropped
      dys = _zeros_for_none(outputs[:differentiable], dys)
      with tf.control_dependencies(dys), tf.name_scope("recompute"):
        replay = [tf.identity(t) for t in args]  # re-run only once the gradients got here
        ys = call(replay)[0][:differentiable]
      return tf.gradients(ys, replay, dys)

    return tuple(outputs) if several else outputs[0], grad

  return recomputed(*[tensors[i] for i in present])


def recompute_in_groups(fn, grouped, shared, groups, axis=1, after=()):
  """concat_i fn(*grouped_i, *shared) along `axis`, where grouped_i holds the i-th of `groups`
  equal slices (along `axis`) of each tensor of `grouped`; fn must act on each slice
  independently (e.g. attention heads along the head axis) and be pure, as in
  `recompute_function`. The groups run one after another, in the forward pass and again in the
  backward pass, which keeps only the inputs and re-runs each group (and takes its slice of the
  output's gradient) once the previous group's gradients are done: one group's attention
  weights and their gradients are alive at a time instead of every head's. `shared` entries
  (e.g. relative position tables; None allowed, no gradient) go to every group; their gradients
  add the groups'.

  `after`: float tensors this function does not use but is ordered after: the first group waits
  for them in the forward pass, and their gradient from here (zeros) waits for the last group's
  gradients. So a recomputation that produced them (`recompute_function`) re-runs in the
  backward pass only after these groups are done instead of alongside them.

  Args:
    fn: (*grouped slices, *shared) -> one tensor, sliced like the grouped inputs along `axis`.
    grouped: list of tensors with equal static sizes along `axis`, divisible by `groups`.
    shared: list of tensors or None.
    groups: int >= 1.
    axis: the axis to slice.
    after: list of tensors.
  Returns:
    fn's output for all slices.
  """
  grouped = [tf.convert_to_tensor(t) for t in grouped]
  after = [tf.convert_to_tensor(t) for t in after]
  if groups == 1 and not after:
    return recompute_function(fn, *(grouped + list(shared)))
  size = grouped[0].shape[axis]
  if groups < 1 or size is None or size % groups:
    raise ValueError("recompute_in_groups: %s slices along axis %d do not split into %r equal "
                     "groups" % (size, axis, groups))
  num_grouped, part = len(grouped), size // groups
  present, with_shared = _present(shared)
  num_shared = len(present)
  after_shapes = [t.shape if t.shape.is_fully_defined() else tf.shape(t) for t in after]

  def group_slices(tensors, index, waits):
    """Group `index` of each tensor, read once the tensors of `waits` exist."""
    with tf.control_dependencies(waits):
      return [slicing.slice_axis(t, axis, index * part, part) for t in tensors]

  @tf.custom_gradient
  def recomputed(*args):
    outputs = []
    for i in range(groups):
      inputs = group_slices(args[:num_grouped], i, outputs[-1:] or list(args[num_grouped +
                                                                              num_shared:]))
      outputs.append(fn(*(inputs + with_shared(args[num_grouped:num_grouped + num_shared]))))

    def grad(dy):
      # Identities of the inputs that wait for dy, sliced per group anew. (Re-reading the
      # forward's per-group pieces here left Grappler's arithmetic optimizer with a step it
      # could not sort topologically: it skipped its rewrites and the step ran 1.25x slower.)
      with tf.control_dependencies([dy]):
        replay = [tf.identity(t) for t in args[:num_grouped + num_shared]]
      shared_replay = with_shared(replay[num_grouped:])
      grouped_grads, shared_grads, waits = [[] for _ in range(num_grouped)], None, []
      for i in range(groups):
        # the group's slice of dy waits too: a gradient term that needs only dy (the relative
        # values' term) would otherwise run for every group at once
        dy_i, *inputs = group_slices([dy] + replay[:num_grouped], i, waits)
        with tf.name_scope("recompute"):
          y2 = fn(*(inputs + shared_replay))
        grads = tf.gradients(y2, inputs + replay[num_grouped:], dy_i)
        for slot, g in zip(grouped_grads, grads[:num_grouped]):
          slot.append(g)
        parts = grads[num_grouped:]
        shared_grads = parts if shared_grads is None else [
            _add(s, p) for s, p in zip(shared_grads, parts)]
        waits = [g for g in grads if g is not None]
      with tf.control_dependencies(waits):
        after_grads = [tf.zeros(shape, t.dtype) for shape, t in zip(after_shapes, after)]
      return ([tf.concat(g, axis=axis) for g in grouped_grads] + shared_grads + after_grads)

    return tf.concat(outputs, axis=axis), grad

  return recomputed(*(grouped + [shared[i] for i in present] + after))
