"""The memory switches, one mechanism: rematerialisation of a block in the backward pass.

`recompute(fn, inputs)` runs fn once in the forward pass and keeps only its inputs; the backward
pass runs fn again once the outputs' gradients exist and differentiates the re-run, as
`tf.recompute_grad` does. Used around a whole layer (hparam `recompute_layers`), around a layer's
attention heads (`recompute_attention`) and per chunk of the output projection and its loss
(`logits_chunk_size`, `chunked_loss`). TF 2.15's own `tf.recompute_grad` cannot re-run a function
that creates variables with `tf.compat.v1.get_variable` (the replay makes them again: "Variable
already exists"), hence this small wrapper on `tf.custom_gradient`.

Randomness is not replayed: callers refuse dropout and random routing inside a recomputed block.
"""
import tensorflow as tf

tf1 = tf.compat.v1


def after(dy, *tensors):
  """Identities of `tensors` that wait for dy: what is computed from them runs in the backward
  pass (the executor would otherwise run it as soon as its inputs exist, and keep it)."""
  with tf.control_dependencies([dy]):
    return [tf.identity(t) for t in tensors]


def recompute(fn, inputs, substitutes=None, differentiable=None):
  """fn(*inputs, replay=False), recomputed in the backward pass (fn(*inputs, replay=True)).

  Args:
    fn: (*inputs, replay) -> a tensor or a tuple of tensors. May create or reuse variables
      (tf.compat.v1.get_variable; the replay reuses the forward's variable scope).
    inputs: list of float tensors; None entries reach fn as None.
    substitutes: optional callable -> {variable.ref(): tensor}, variables the replay read
      through these forward tensors (the centroids, which the EMA update moves in between).
    differentiable: how many leading outputs carry gradients (default all); the others are
      side outputs with the forward's values.
  Returns:
    fn's outputs of the forward call.
  """
  scope = tf1.get_variable_scope()
  present = [i for i, t in enumerate(inputs) if t is not None]
  several = []

  def call(args, replay):
    full = list(inputs)
    for i, t in zip(present, args):
      full[i] = t
    ys = fn(*full, replay=replay)
    if not replay:
      several.append(isinstance(ys, tuple))
    return list(ys) if isinstance(ys, tuple) else [ys]

  @tf.custom_gradient
  def block(*args):
    ys = call(args, False)
    keep = len(ys) if differentiable is None else differentiable
    ys = ys[:keep] + [tf.stop_gradient(t) for t in ys[keep:]]

    def grad(*dys, variables=None):
      dys = [tf.zeros_like(y) if d is None else d for y, d in zip(ys[:keep], dys[:keep])]
      # stop_gradient: tf.gradients must not follow a variable's path upstream of an input
      replay_args = [tf.stop_gradient(t) for t in after(dys[0], *args)]
      with tf1.variable_scope(scope, reuse=True), tf.name_scope("recompute"):
        ys2 = call(replay_args, True)[:keep]
      variables = list(variables or [])
      subs = substitutes() if substitutes is not None else {}
      sub_tensors = [subs.get(v.ref()) for v in variables]
      extra = [t for t in sub_tensors if t is not None]
      grads = tf.gradients(ys2, replay_args + variables + extra, dys)
      var_grads, extra_grads = grads[len(args):len(args) + len(variables)], iter(
          grads[len(args) + len(variables):])
      var_grads = [g if t is None else _add(g, next(extra_grads))
                   for g, t in zip(var_grads, sub_tensors)]
      return grads[:len(args)], var_grads

    return tuple(ys), grad

  results = list(block(*[inputs[i] for i in present]))
  return tuple(results) if several[0] else results[0]


def _add(a, b):
  return b if a is None else a if b is None else a + b


def refuse_random(rates, name):
  """ValueError naming the hparams whose random numbers a re-run would draw again."""
  on = [key for key, value in rates.items() if value]
  if on:
    raise ValueError("%s re-runs its block in the backward pass and would draw new random "
                     "numbers; set %s to 0/False or turn %s off" % (name, " and ".join(on), name))


def chunk_bounds(length, chunk):
  """[(start, size)] of consecutive chunks of `chunk` positions covering `length`."""
  if chunk <= 0:
    raise ValueError("chunk_bounds: chunk must be positive, got %d." % chunk)
  return [(start, min(chunk, length - start)) for start in range(0, length, chunk)]


def project(x, kernel, bias):
  """x [b, n, e] kernel [e, V] + bias [V] -> logits [b, n, V], as a dense layer."""
  out = tf.tensordot(x, kernel, [[x.shape.rank - 1], [0]])
  out.set_shape(x.shape[:-1].concatenate(kernel.shape[-1:]))
  return tf.nn.bias_add(out, bias)


def chunked_loss(x, kernel, bias, labels, weights, chunk, xent):
  """sum_i weights_i * xent(project(x_i), labels_i), `chunk` positions at a time, each chunk
  recomputed in the backward pass, one after the other: at most one chunk's [b, chunk, V]
  logits are alive. Equal to the unchunked loss up to the order of the float sums.

  Args:
    x: [b, n, e] (n static); kernel [e, V]; bias [V]; labels int [b, n]; weights float [b, n].
    chunk: positions per chunk; xent: (logits [b, c, V], labels [b, c]) -> float32 [b, c].
  Returns:
    float32 scalar.
  """
  if x.shape.rank != 3 or x.shape[1] is None:
    raise ValueError("chunked_loss: x must be [batch, length, depth] with a static length, got "
                     "%s." % x.shape)
  bounds = chunk_bounds(x.shape[1], chunk)
  pieces = tf.split(x, [size for _, size in bounds], axis=1)  # its gradient: one concat
  total, previous = None, []
  for (start, size), piece in zip(bounds, pieces):
    def part(x_c, kernel, bias, replay, start=start, size=size):
      del replay
      losses = xent(project(x_c, kernel, bias), labels[:, start:start + size])
      return tf.reduce_sum(losses * weights[:, start:start + size])

    with tf.control_dependencies(previous):  # one chunk's logits at a time
      x_c = tf.identity(piece)
    value = recompute(part, [x_c, kernel, bias])
    total, previous = _add(total, value), [value]
  return total
