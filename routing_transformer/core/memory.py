"""Rematerialisation, one mechanism: `recompute(fn, inputs)` keeps fn's inputs and re-runs fn in
the backward pass (`tf.custom_gradient`: TF 2.15's `tf.recompute_grad` cannot replay
tf.compat.v1 variables); `recompute_tensors` the same for functions of tensors alone (a
GradientTape: eager too). Always around small blocks whose intermediates TF's own gradients would
keep (GEGLU's activation and output projection, each normalisation, the Shaw value term, local
attention's key blocks); by switch around a layer (`recompute_layers`), its heads
(`recompute_attention`: the routing heads together, the local heads a group at a time),
feed-forward chunks (`ffn_chunk_size`) and logits chunks (`logits_chunk_size`). Random numbers
are not replayed: callers keep them outside a block or refuse them."""
import tensorflow as tf

tf1 = tf.compat.v1


def after(dy, *tensors):
  """Identities of `tensors` that wait for dy (what uses them runs in the backward pass)."""
  with tf.control_dependencies([dy]):
    return [tf.identity(t) for t in tensors]


def recompute_tensors(fn, *tensors, serial=None):
  """fn(*tensors) for a function of float tensors alone (no variables, no random numbers),
  keeping only `tensors` for the backward pass, which runs fn again once the output's gradient
  exists; a GradientTape, so it works eagerly too (Keras). serial: an optional list shared by
  calls: each re-run waits for the previous one's gradients (graph mode)."""
  @tf.custom_gradient
  def block(*args):
    def grad(dy):
      # The re-run reads args through one IdentityN that waits for dy (and the previous
      # re-run): a data path, which Grappler keeps, where control inputs on the re-run's own ops
      # were dropped by its rewrites (pow(x, 3) -> x * square(x) made a square without them, run
      # in the forward pass and kept); not through one Identity per arg, which its arithmetic
      # optimizer hoists out of a split's outputs into a cycle (the chunks).
      with tf.control_dependencies([dy] + (serial[-1:] if serial else [])):
        replay = tf.identity_n(list(args))
      with tf.GradientTape() as tape:
        tape.watch(replay)
        y = fn(*replay)
      grads = tape.gradient(y, replay, output_gradients=dy)
      if serial is not None and not tf.executing_eagerly():
        serial.append(tf.group([g for g in grads if g is not None]))
      return grads
    return fn(*args), grad
  return block(*tensors)


def chunked(fn, xs, others, chunk):
  """fn(*xs, *others) `chunk` entries of axis 1 (static) at a time, each chunk a
  `recompute_tensors` block re-run after the previous chunk's gradients: the backward pass holds
  one chunk's intermediates. Positions, x [b, n, e] (Kitaev et al. 2020's chunked feed-forward),
  or heads, q, k, v [b, h, n, d] (`recompute_attention`'s local heads)."""
  sizes = [size for _, size in chunk_bounds(xs[0].shape[1], chunk)]
  serial = []
  return tf.concat([recompute_tensors(fn, *pieces, *others, serial=serial)
                    for pieces in zip(*(tf.split(x, sizes, axis=1) for x in xs))], axis=1)


def recompute(fn, inputs, substitutes=None, differentiable=None):
  """fn(*inputs, replay=False), recomputed in the backward pass (fn(*inputs, replay=True)).

  Args:
    fn: (*inputs, replay) -> tensor(s); may make tf.compat.v1 variables (replay reuses them).
    inputs: list of float tensors; None entries reach fn as None.
    substitutes: optional callable -> {variable.ref(): tensor}, variables the replay reads
      through forward tensors (the centroids, which the EMA update moves in between).
    differentiable: how many leading outputs carry gradients (default all).
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


def recompute_heads(attend, qkv, tables, options):
  """attend(qkv, tables, options) -> (routing heads [b, h, n, d], routing result), keeping only
  q, k, v, the tables and the logit scale for the backward pass (`recompute_attention`), which
  routes again."""
  scale = options.get("logit_scale")
  scale = scale if isinstance(scale, (tf.Tensor, tf.Variable)) else None
  inputs = [tf.convert_to_tensor(t) if t is not None else None
            for t in list(qkv) + list(tables) + [scale]]
  keys, kind = [], []

  def fn(q, k, v, rel_k, rel_v, scale, replay):
    kw = dict(options, logit_scale=scale) if scale is not None else options
    out, aux = attend((q, k, v), (rel_k, rel_v), kw)
    items = aux._asdict() if hasattr(aux, "_asdict") else dict(aux)  # Routed, or causal_window's
    if not replay:
      kind.append(type(aux))
      keys.extend(sorted(k for k, t in items.items() if t is not None and k != "commitment_loss"))
    return (out, items["commitment_loss"]) + tuple(items[k] for k in keys)

  result = recompute(fn, inputs, differentiable=2)
  values = dict(zip(keys, result[2:]), commitment_loss=result[1])
  return result[0], values if kind[0] is dict else kind[0](**values)


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
  """sum_i weights_i * xent(project(x_i), labels_i) (float32 scalar), `chunk` positions at a
  time, each chunk recomputed in the backward pass: x [b, n, e] (n static), kernel [e, V], bias
  [V], labels int [b, n], weights [b, n]; xent: (logits [b, c, V], labels [b, c]) -> [b, c]."""
  if x.shape.rank != 3 or x.shape[1] is None:
    raise ValueError("chunked_loss: x must be [batch, length, depth] with a static length, got "
                     "%s." % x.shape)
  sizes = [size for _, size in chunk_bounds(x.shape[1], chunk)]
  total, previous, serial = None, [], []
  for x_c, labels_c, weights_c in zip(*(tf.split(t, sizes, axis=1) for t in (x, labels, weights))):
    def part(x_c, kernel, bias, labels_c=labels_c, weights_c=weights_c):
      return tf.reduce_sum(xent(project(x_c, kernel, bias), labels_c) * weights_c)

    with tf.control_dependencies(previous):  # one chunk's logits at a time
      x_c = tf.identity(x_c)
    value = recompute_tensors(part, x_c, kernel, bias, serial=serial)
    total, previous = _add(total, value), [value]
  return total
