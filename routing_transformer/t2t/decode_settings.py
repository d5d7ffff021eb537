"""T2T's decoding settings for the cached decoder (`core/decoding.py`): --decode_hparams'
sampling values over the model hparams', and `T2TModel.infer`."""
import tensorflow as tf

from routing_transformer.core import decoding
from routing_transformer.core import sampling

# The decode hparams' "not set: use the model hparams" values.
UNSET = {"sampling_method": "", "sampling_temp": -1.0, "sampling_keep_top_k": -2,
         "nucleus_sampling": -1.0}


def sampling_settings(hparams, decode_hparams=None):
  """(temperature, top_k, top_p) of the hparams, overridden by set decode hparams: "argmax" is
  greedy; "random" uses sampling_temp, sampling_keep_top_k (-1, 0: off), nucleus_sampling."""
  values = {}
  for name, unset in UNSET.items():
    value = decode_hparams.get(name, unset) if decode_hparams is not None else unset
    values[name] = hparams.get(name, unset) if value == unset else value
  method = values["sampling_method"] or "argmax"
  if method not in ("argmax", "random"):
    raise decoding.DecodeError("sampling_method=%r: use 'argmax' (greedy) or 'random'." % method)
  given = lambda name, default: default if values[name] == UNSET[name] else values[name]
  top_p = 1.0 if values["nucleus_sampling"] is None else given("nucleus_sampling", 1.0)
  top_k = given("sampling_keep_top_k", -1)
  temperature = 0.0 if method == "argmax" else given("sampling_temp", 1.0)
  try:
    sampling.check_sampling(temperature, top_k, top_p)
  except ValueError as e:
    raise decoding.DecodeError(str(e))
  return temperature, top_k, top_p


def inherited_top_p_note(hparams, decode_hparams=None):
  """A one-line note when random sampling takes a top-p < 1 from the hparams set (every set
  inherits nucleus_sampling=0.9 from the original's `sparse_transformer_local`), else None."""
  temperature, _, top_p = sampling_settings(hparams, decode_hparams)
  set_here = (decode_hparams is not None and
              decode_hparams.get("nucleus_sampling", UNSET["nucleus_sampling"]) !=
              UNSET["nucleus_sampling"])
  if temperature == 0.0 or top_p >= 1.0 or set_here:
    return None
  return ("sampling: nucleus_sampling=%g (top-p) comes from the hparams set; pass "
          "--decode_hparams=nucleus_sampling=1.0 to sample from the whole distribution" % top_p)


def infer(model, features, decode_length, beam_size=1, top_beams=1, alpha=0.0, beam_search=None):
  """T2TModel.infer: sampling / greedy (beam_size 1) or `beam_decode`."""
  decode_hparams = getattr(model, "_decode_hparams", None)
  decoding.check_cached_decoding(model.hparams)
  if "inputs" not in features and "targets" not in features:
    # unconditional samples (t2t-decoder keeps only "infer_targets"): an empty prefix
    features["targets"] = tf.zeros([decoding.batch_size_of(features, None), 0, 1, 1], tf.int32)
  if beam_size > 1:
    return decoding.beam_decode(model, features, decode_length, beam_size, top_beams, alpha,
                                beam_search)
  temperature, top_k, top_p = sampling_settings(model.hparams, decode_hparams)
  result = decoding.sample_loop(model, features, decode_length, temperature, top_k, top_p)
  return {"outputs": result["outputs"], "scores": None}
