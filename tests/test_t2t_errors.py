"""One-line errors of the stock T2T binaries, in-process: the function each binary calls, with the
arguments its flags give, stops (SystemExit) or fails (an exception the error hook turns into one
line) with the message naming the fix; and the registry `t2t-trainer --registry_help` prints.

One case of each kind runs through the binary itself (a fresh process spends ~10 s importing):
test_t2t_binaries (the create_hparams guard: an unknown hparams set, a check_hparams failure; an
unknown problem; t2t-datagen's misspelt problem; a checkpoint of other hparams), test_t2t_decoder
(a prompt longer than the model) and test_reliability (t2t-trainer on a damaged checkpoint).
"""
import types

import numpy as np
import pytest
from absl import flags

import t2t_usr_dir  # pylint: disable=unused-import  (registers everything, installs the glue)
from routing_transformer.t2t import checkpoint_files
from routing_transformer.t2t import glue as t2t_glue
from tensor2tensor.utils import decoding
from tensor2tensor.utils import registry
from tensor2tensor.utils import t2t_model
from tensor2tensor.utils import trainer_lib


def decoder_hparams(output_dir):
  """The hparams t2t-decoder makes (its create_hparams) for routing_transformer_tiny on
  synthetic_long_range (no data needed: the problem's encoder is built in)."""
  return trainer_lib.create_hparams("routing_transformer_tiny", "", data_dir=str(output_dir),
                                    problem_name="synthetic_long_range",
                                    hparams_path=str(output_dir / "hparams.json"))


@pytest.fixture
def command_line(monkeypatch):
  """command_line(name=value, ...): absl's FLAGS for this test are those flags parsed from a
  command line (`--name=value`), as a binary's; the glue reads --model and --problem from it."""
  def parse(**values):
    parsed = flags.FlagValues()
    for name in values:
      flags.DEFINE_string(name, None, name, flag_values=parsed)
    parsed(["binary"] + ["--%s=%s" % item for item in values.items()])
    monkeypatch.setattr(flags, "FLAGS", parsed)
    return parsed
  return parse


def exit_message(excinfo):
  """The text a SystemExit prints (its code), checked to be one line starting with error:."""
  text = excinfo.value.code
  assert isinstance(text, str) and text.startswith("error: ") and "\n" not in text, text
  return text


def test_registry_lists_everything():
  """What `t2t-trainer --registry_help` prints (registry.help_string) names our registrations."""
  text = registry.help_string()
  for name in ("routing_transformer", "sparse_transformer", "routing_transformer_mtf",
               "pg19_local_cluster8k", "routing_transformer_tiny", "cifar10_routing_h4_l8_w512",
               "synthetic_long_range"):
    assert name in text, name


def test_unknown_model_is_one_line():
  """t2t-trainer --model=no_such_model: create_estimator's registry look-up raises T2T's KeyError;
  the error hook prints it as one line (an unknown problem through the binary:
  test_t2t_binaries)."""
  hparams = trainer_lib.create_hparams("routing_transformer_tiny", "")
  with pytest.raises(KeyError) as error:
    t2t_model.T2TModel.make_estimator_model_fn("no_such_model", hparams)
  assert t2t_glue.unknown_name_message(error.value) == (
      "unknown model 'no_such_model'. This project's: routing_transformer, sparse_transformer, "
      "routing_transformer_mtf (all registered names: t2t-trainer --registry_help).")


def test_datagen_without_a_problem_names_the_flag(command_line):
  """t2t-datagen --problem= (empty) raises the same ValueError as a misspelt name (listing every
  T2T problem); the error hook prints one line asking for --problem (the misspelt name through
  the binary: test_t2t_binaries)."""
  error = ValueError(t2t_glue.DATAGEN_NO_PROBLEM + ":\n  * algorithmic_addition_binary40\n"
                     "TIMIT and parsing need data_sets specified with --timit_paths and "
                     "--parsing_path.")  # t2t_datagen.main's text (not imported: its flags)
  command_line(problem="")
  assert t2t_glue.datagen_problem_message(error) == (
      "t2t-datagen needs --problem=NAME, e.g. --problem=synthetic_long_range.")
  command_line(problem="synthetic_long_rnage")
  assert t2t_glue.datagen_problem_message(error).startswith(
      "unknown problem 'synthetic_long_rnage'. This project's: ")


def test_decoder_stops_on_an_empty_prompt_file(command_line, tmp_path):
  """t2t-decoder --decode_from_file=EMPTY: decoding.decode_from_file (our guard) stops before any
  graph is built (a prompt longer than the model through the binary: test_t2t_decoder)."""
  checkpoint_files.write_checkpoint(str(tmp_path / "model.ckpt-1"),
                                    {"w": np.zeros(2, np.float32)})
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("")
  command_line(model="routing_transformer", problem="synthetic_long_range")
  hparams = decoder_hparams(tmp_path)
  estimator = types.SimpleNamespace(model_dir=str(tmp_path))  # what the guards read of it
  with pytest.raises(SystemExit) as stop:
    decoding.decode_from_file(estimator, str(prompts), hparams,
                              decoding.decode_hparams("beam_size=1"), str(tmp_path / "out.txt"))
  assert "has no prompts" in exit_message(stop)
  assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("decode_hparams,message", [
    ("beam_size=1,sampling_method=random,nucleus_sampling=1.5", "nucleus top-p must be in (0, 1]"),
    ("beam_size=1,sampling_method=random,sampling_keep_top_k=-3", "top-k must be >= 0"),
], ids=["bad_p", "bad_k"])
def test_decoder_stops_on_bad_sampling_settings(decode_hparams, message, tmp_path):
  """t2t-decoder --decode_hparams=...: our sampling keys parse (decoding.decode_hparams), and
  trainer_lib.create_estimator stops before the Estimator exists, as t2t-decoder calls it."""
  hparams = decoder_hparams(tmp_path)
  decode_hp = decoding.decode_hparams(decode_hparams)
  with pytest.raises(SystemExit) as stop:
    trainer_lib.create_estimator("routing_transformer", hparams, None, decode_hparams=decode_hp)
  assert message in exit_message(stop)


def test_mtf_bad_layout_fails_fast_with_the_fix(command_line, tmp_path):
  """t2t-trainer --model=routing_transformer_mtf with a layout the mesh cannot split: the Mesh-TF
  guard of trainer_lib.create_hparams (called as t2t-trainer calls it) stops with one line (every
  check's message: test_mtf_model)."""
  command_line(model="routing_transformer_mtf", problem="synthetic_long_range")
  with pytest.raises(SystemExit) as stop:
    trainer_lib.create_hparams("routing_transformer_mtf_tiny",
                               "mesh_shape=model:4,layout=routing_heads:model",
                               hparams_path=str(tmp_path / "hparams.json"))
  text = exit_message(stop)
  assert text.startswith("error: --model=routing_transformer_mtf: ")
  assert "routing_heads (size 2) is not divisible by mesh dimension model:4" in text
