"""Stock t2t-decoder on the shared trained run (conftest.trained_run): prompts from a file, a prompt
longer than the model, unconditional samples. The other bad input (an empty prompt file, bad
sampling settings) stops before any graph exists: test_t2t_errors checks it in-process."""
import glob
import os

import pytest

from conftest import run_t2t

pytestmark = pytest.mark.slow
t2t = run_t2t


def decode(trained_dir, data_dir, prompts_file, out_file, decode_hparams, timeout=300):
  return t2t("t2t-decoder", "--problem=synthetic_long_range", "--model=routing_transformer",
             "--hparams_set=routing_transformer_tiny", "--data_dir=" + data_dir,
             "--output_dir=" + trained_dir, "--decode_from_file=" + prompts_file,
             "--decode_to_file=" + out_file, "--decode_hparams=" + decode_hparams,
             timeout=timeout)


@pytest.mark.parametrize("decode_hparams", [
    "beam_size=1,extra_length=10,batch_size=3",
    "beam_size=1,extra_length=10,batch_size=2,sampling_method=random,nucleus_sampling=0.8,"
    "sampling_keep_top_k=5",
    "beam_size=3,extra_length=6,batch_size=3",
], ids=["greedy", "nucleus_top_k", "beam"])
def test_decoder_continues_prompts_from_a_file(trained, data_dir, tmp_path, decode_hparams):
  """Stock t2t-decoder on the tiny checkpoint: one `prompt<TAB>continuation` line per prompt."""
  from problems import synthetic  # pylint: disable=g-import-not-at-top
  prompts = ["v3 k5 v7 k1 f0 f1 f2", "", "k2 v9"]  # the empty line: an unconditional sample
  prompts_file, out_file = str(tmp_path / "prompts.txt"), str(tmp_path / "decodes.txt")
  with open(prompts_file, "w") as f:
    f.write("\n".join(prompts) + "\n")
  run = decode(trained[0], data_dir, prompts_file, out_file, decode_hparams)
  assert run.returncode == 0, run.stderr[-4000:]
  with open(out_file) as f:
    lines = f.read().split("\n")
  assert lines[-1] == "" and len(lines) == 4, lines
  words = []
  for prompt, line in zip(prompts, lines):
    written_prompt, text = line.split("\t")
    assert written_prompt == prompt
    words += text.split()
    assert len(text.split()) <= int(decode_hparams.split("extra_length=")[1].split(",")[0])
  if "beam_size=1," in decode_hparams:
    assert words, "no prompt got a continuation"
  # Beam search may rightly end every prompt at once: the finished hypothesis "EOS now" scores
  # log p(EOS), the live ones six tokens' summed log-probabilities, and a 10-step model gives EOS
  # more than that. test_decoding checks beam search itself (forced prompt, beats greedy).
  for word in words:  # every generated token decodes to a real synthetic token
    assert word != "<pad>" and synthetic.token_id(word) >= 0


def test_decoder_rejects_a_too_long_prompt_clearly(trained, data_dir, tmp_path):
  """One line, no traceback (an empty prompt file and bad sampling settings: test_t2t_errors)."""
  prompts_file = str(tmp_path / "prompts.txt")
  with open(prompts_file, "w") as f:
    f.write(" ".join("f%d" % (i % 8) for i in range(513)))
  run = decode(trained[0], data_dir, prompts_file, str(tmp_path / "out.txt"), "beam_size=1",
               timeout=120)
  assert run.returncode != 0
  assert "the prompt is 513 tokens, longer than the model's max_target_length=512" in \
      run.stderr.strip().splitlines()[-1] and "Traceback" not in run.stderr


def test_decoder_samples_unconditionally_without_a_prompt_file(trained, data_dir, tmp_path):
  """Without --decode_from_file, t2t-decoder draws samples (batch taken from the dev data)."""
  from problems import synthetic  # pylint: disable=g-import-not-at-top
  out_file = str(tmp_path / "samples")
  run = t2t("t2t-decoder", "--problem=synthetic_long_range", "--model=routing_transformer",
            "--hparams_set=routing_transformer_tiny", "--data_dir=" + data_dir,
            "--output_dir=" + trained[0], "--decode_to_file=" + out_file,
            "--decode_hparams=beam_size=1,extra_length=8,num_samples=2,batch_size=2,"
            "sampling_method=random", timeout=300)
  assert run.returncode == 0, run.stderr[-4000:]
  decodes = glob.glob(out_file + "*.decodes")
  assert decodes, os.listdir(str(tmp_path))
  with open(decodes[0]) as f:
    lines = f.read().split("\n")
  assert len(lines) == 3 and lines[-1] == "", lines
  words = " ".join(lines).split()
  assert words and all(len(line.split()) <= 8 for line in lines)
  assert all(synthetic.token_id(w) >= 0 for w in words)
