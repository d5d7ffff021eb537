"""Cached decoding (sampling, greedy, beam search): each step runs the new position only, over
caches of static length N = max_target_length; a prompt (right-padded with 0) runs through the
same steps, its tokens forced (one routing rule). Outputs are the continuations only."""
import collections
import contextlib

import tensorflow as tf

from routing_transformer.core import layers
from routing_transformer.core import sampling
from routing_transformer.core.attention import common

tf1 = tf.compat.v1

PAD_ID = 0
EOS_ID = 1


class DecodeError(ValueError):
  """Bad decoding input or settings; the message names the fix."""


def check_cached_decoding(hparams):
  """Raises DecodeError for models the cached decoder does not run (fast_decode=False does)."""
  if hparams.legacy_causal_key_routing and not hparams.share_qk:
    raise DecodeError("legacy_causal_key_routing=True with share_qk=False has no cached decoder "
                      "(the original routed keys over the whole sequence); decode with "
                      "--hparams=fast_decode=False.")
  if hparams.activation_dtype != "float32":
    raise DecodeError("activation_dtype=%s has no cached decoder; decode with "
                      "--hparams=activation_dtype=float32 (the variables are float32: the same "
                      "checkpoint loads)." % hparams.activation_dtype)


def decode_length_of(hparams):
  """The static cache length N (max_target_length, else max_length)."""
  return hparams.max_target_length or hparams.max_length


def prompt_of(model, features):
  """Prompt ids [b, P]: features["partial_targets"], else a decoder-only model's "inputs"."""
  prompt = features.get("partial_targets")
  if prompt is None and model.hparams.num_encoder_layers <= 0:
    prompt = features.get("inputs")
  if prompt is None:
    return None
  prompt = tf.cast(prompt, tf.int32)
  return tf.reshape(prompt, tf.shape(prompt)[:2])


def batch_size_of(features, prompt):
  """The batch size (int32 scalar)."""
  for tensor in (prompt, features.get("inputs"), features.get("targets"),
                 features.get("infer_targets")):
    if tensor is not None:
      return tf.shape(tensor)[0]
  return 1


@contextlib.contextmanager
def model_scope(model):
  """The model's variable scopes `<name>/body`, with reuse."""
  with tf1.variable_scope(model.name, reuse=tf1.AUTO_REUSE):
    with tf1.variable_scope("body"):
      yield


def encoder_memory(model, features):
  """Per decoder layer (keys, values) of the encoder output, and its padding; or (None, None)."""
  hparams = model.hparams
  if hparams.num_encoder_layers <= 0 or "inputs" not in features:
    return None, None
  with model_scope(model):
    memory, memory_padding, _ = model.encode(features)
    memory_kv = []
    for i in range(hparams.num_decoder_layers):
      scope = "decoder_layer_%d/self_attention/encdec_attention" % i
      with tf1.variable_scope(scope):
        memory_kv.append(layers.encdec_memory(memory, hparams))
  return memory_kv, memory_padding


def decode_step(model, ids, position, caches, memory_kv=None, memory_padding=None):
  """(float32 logits [b, vocab] of position t, updated caches) from ids int32 [b], the tokens at
  t - 1; caches: per layer (`layers.self_attention_cache`); memory: from `encoder_memory`."""
  hparams = model.hparams
  updated = [dict(cache) for cache in caches]  # self_attention updates them in place

  def attend(y, i):
    return layers.self_attention(y, hparams, i, cache=updated[i], position=position)[0]

  memory_attend = None if memory_kv is None else (
      lambda y, i: layers.encdec_attention(y, memory_kv[i], hparams, memory_padding,
                                           position=position))
  with model_scope(model):
    x = model.embed(ids[:, tf.newaxis], "embeddings", position=position)
    x = model.layer_stack(x, "decoder", hparams.num_decoder_layers, attend, memory_attend)
    logits = model.logits(x)[:, 0]
  return tf.cast(logits, tf.float32), updated


def without_padding(logits):
  """logits [b, vocab] with the padding id masked: generation never emits PAD (id 0)."""
  is_pad = tf.equal(tf.range(tf.shape(logits)[-1]), PAD_ID)[tf.newaxis, :]
  return tf.where(is_pad, common.mask_value(logits.dtype), logits)


def padded_prompt(prompt, batch, length):
  """(prompt ids [b, N] padded with 0, lengths [b]); fails if a prompt exceeds N."""
  if prompt is None:
    return tf.zeros([batch, length], tf.int32), tf.zeros([batch], tf.int32)
  prompt_length = tf.reduce_sum(tf.cast(tf.not_equal(prompt, 0), tf.int32), axis=1)
  check = tf.debugging.assert_less_equal(
      tf.shape(prompt)[1], length,
      message="prompt longer than the model's max_target_length = %d tokens; shorten the "
      "prompt (or raise max_target_length)" % length)
  with tf.control_dependencies([check]):
    ids = tf.pad(prompt, [[0, 0], [0, tf.maximum(length - tf.shape(prompt)[1], 0)]])
  ids = tf.reshape(ids[:, :length], [batch, length])
  return ids, prompt_length


def continuation(tokens, prompt_length, decode_length):
  """tokens [b, N] -> the decode_length tokens after each row's prompt [b, L] (0 past N)."""
  length = tokens.shape[-1] if tokens.shape[-1] is not None else tf.shape(tokens)[-1]
  index = prompt_length[:, tf.newaxis] + tf.range(decode_length)[tf.newaxis, :]
  taken = tf.gather(tokens, tf.minimum(index, length - 1), batch_dims=1)
  return tf.where(index < length, taken, tf.zeros_like(taken))


# What both decoders start from (prompt_ids [b, N], prompt_length [b], memory_kv may be None).
DecodeSetup = collections.namedtuple(
    "DecodeSetup", "length batch prompt_ids prompt_length memory_kv memory_padding caches vocab")


def decode_setup(model, features):
  """Builds the DecodeSetup of `features` (prompt, encoder memory, empty caches)."""
  hparams, length = model.hparams, decode_length_of(model.hparams)
  prompt = prompt_of(model, features)
  batch = batch_size_of(features, prompt)
  prompt_ids, prompt_length = padded_prompt(prompt, batch, length)
  memory_kv, memory_padding = encoder_memory(model, features)
  caches = [layers.self_attention_cache(hparams, i, batch, length)
            for i in range(hparams.num_decoder_layers)]
  vocab = model._problem_hparams.vocab_size["targets"]  # pylint: disable=protected-access
  return DecodeSetup(length, batch, prompt_ids, prompt_length, memory_kv, memory_padding, caches,
                     vocab)


def sample_loop(model, features, decode_length, temperature=0.0, top_k=-1, top_p=1.0,
                return_logits=False, seed=None):
  """Greedy or sampled decoding in one tf.while_loop: up to `decode_length` tokens after each
  prompt, stopping after EOS or at N. Returns {"outputs" int32 [b, decode_length], "tokens" [b, N],
  "prompt_length" [b], with return_logits "logits" [b, N, vocab]}."""
  length, batch, prompt_ids, prompt_length, memory_kv, memory_padding, caches, vocab = (
      decode_setup(model, features))
  end = tf.minimum(prompt_length + decode_length, length)  # exclusive end of each row
  logits_buffer = tf.zeros([batch, length, vocab] if return_logits else [batch, 1, 1])

  def step(t, previous, tokens, caches, finished, logits_buffer):
    logits, caches = decode_step(model, previous, t, caches, memory_kv, memory_padding)
    drawn = sampling.sample(without_padding(logits), temperature, top_k, top_p, seed=seed)
    forced = t < prompt_length
    token = tf.where(forced, prompt_ids[:, t], drawn)
    token = tf.where(finished, tf.zeros_like(token), token)
    at_t = tf.stack([tf.range(batch), tf.fill([batch], t)], axis=1)  # [b, 2]: (row, t)
    tokens = tf.tensor_scatter_nd_update(tokens, at_t, token)
    finished = tf.logical_or(finished, tf.logical_and(tf.logical_not(forced),
                                                      tf.equal(token, EOS_ID)))
    finished = tf.logical_or(finished, t + 1 >= end)
    if return_logits:
      logits_buffer = tf.tensor_scatter_nd_update(logits_buffer, at_t, logits)
    return t + 1, token, tokens, caches, finished, logits_buffer

  # step 0 outside the loop creates the variables outside control flow
  state = step(tf.constant(0), tf.zeros([batch], tf.int32), tf.zeros([batch, length], tf.int32),
               caches, end <= 0, logits_buffer)
  state = tf.while_loop(
      lambda t, previous, tokens, caches, finished, buf: tf.logical_and(
          t < length, tf.logical_not(tf.reduce_all(finished))),
      step, state, maximum_iterations=length - 1)
  _, _, tokens, _, _, logits_buffer = state
  tokens.set_shape([None, length])
  result = {"outputs": continuation(tokens, prompt_length, decode_length), "tokens": tokens,
            "prompt_length": prompt_length}
  if return_logits:
    result["logits"] = logits_buffer
  return result


def beam_decode(model, features, decode_length, beam_size, top_beams=1, alpha=0.0,
                beam_search=None):
  """Beam search (`beam_search` as Tensor2Tensor's) over the cached decoder, prompts forced, EOS
  forced after each row's decode_length tokens (rows ranked at their own length). Returns
  {"outputs" [b, (top_beams,) decode_length], "scores" [b] or [b, top_beams]}."""
  setup = decode_setup(model, features)
  length, batch, prompt_ids, prompt_length, memory_kv, memory_padding, caches, vocab = setup
  steps = tf.minimum(tf.reduce_max(prompt_length) + decode_length + 1, length)
  states = {"caches": caches, "prompt_ids": prompt_ids, "prompt_length": prompt_length}
  if memory_kv is not None:
    states.update(memory=memory_kv, memory_padding=memory_padding)
  # the variables, outside the beam-search loop
  decode_step(model, tf.zeros([batch], tf.int32), tf.constant(0), states["caches"], memory_kv,
              memory_padding)

  # beam_search relaxes every inner dimension; the attention needs the static ones
  shapes = tf.nest.map_structure(lambda t: tf.TensorShape([None]).concatenate(t.shape[1:]),
                                 states)

  def symbols_to_logits(ids, i, states):
    tf.nest.map_structure(lambda t, shape: t.set_shape(shape), states, shapes)
    logits, caches = decode_step(model, ids[:, -1], i, states["caches"],
                                 states.get("memory"), states.get("memory_padding"))
    forced = i < states["prompt_length"]  # [b * beam]
    prompt_token = states["prompt_ids"][:, tf.minimum(i, length - 1)]
    one_hot = tf.one_hot(prompt_token, vocab, on_value=0.0, off_value=-1e9)
    logits = tf.where(forced[:, tf.newaxis], one_hot,
                      tf.nn.log_softmax(without_padding(logits)))
    # EOS at the row's end, PAD after it (a later EOS would finish the beam again)
    end = states["prompt_length"] + decode_length  # [b * beam]
    after_end = tf.one_hot(tf.where(tf.equal(i, end), EOS_ID, PAD_ID), vocab, on_value=0.0,
                           off_value=-1e9)
    logits = tf.where(tf.greater_equal(i, end)[:, tf.newaxis], after_end, logits)
    states = dict(states, caches=caches)
    return logits, states

  if beam_search is None:
    raise DecodeError("beam_decode needs beam_search= (e.g. Tensor2Tensor's "
                      "tensor2tensor.utils.beam_search.beam_search).")
  ids, scores, _ = beam_search(
      symbols_to_logits, tf.zeros([batch], tf.int32), beam_size, steps, vocab, alpha,
      states=states, eos_id=EOS_ID, stop_early=True)
  tokens = ids[:, :, 1:]  # [b, beam, T]: targets at positions 0..T-1
  pad = tf.maximum(length - tf.shape(tokens)[2], 0)
  tokens = tf.pad(tokens, [[0, 0], [0, 0], [0, pad]])[:, :, :length]
  outputs = [continuation(tokens[:, j], prompt_length, decode_length) for j in range(top_beams)]
  if top_beams == 1:
    return {"outputs": outputs[0], "scores": scores[:, 0]}
  return {"outputs": tf.stack(outputs, axis=1), "scores": scores[:, :top_beams]}
