"""End to end through the stock T2T binaries with --t2t_usr_dir=t2t_usr_dir (one shared run)."""
import glob
import os

import pytest

from conftest import run_t2t
from conftest import synthetic_data

pytestmark = pytest.mark.slow
t2t = run_t2t


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  return synthetic_data(tmp_path_factory, "data", 400, 40)


@pytest.fixture(scope="session")
def trained(data_dir, tmp_path_factory):
  """One tiny routing model trained, evaluated and checkpointed by stock t2t-trainer (TensorFlow's
  C++ warnings shown, so the log shows whether placement warnings come back)."""
  out = str(tmp_path_factory.mktemp("train"))
  run = t2t("t2t-trainer", "--problem=synthetic_long_range", "--model=routing_transformer",
            "--hparams_set=routing_transformer_tiny", "--data_dir=" + data_dir,
            "--output_dir=" + out, "--train_steps=10", "--eval_steps=1",
            "--local_eval_frequency=10", "--schedule=continuous_train_and_eval",
            env={"TF_CPP_MIN_LOG_LEVEL": "1"})
  assert run.returncode == 0, run.stderr[-4000:]
  return out, run.stderr


def test_registry_lists_everything():
  run = t2t("t2t-trainer", "--registry_help")
  text = run.stdout + run.stderr
  for name in ("routing_transformer", "sparse_transformer", "pg19_local_cluster8k",
               "routing_transformer_tiny", "cifar10_routing_h4_l8_w512", "synthetic_long_range"):
    assert name in text, name


def test_trainer_trains_evaluates_and_checkpoints(trained):
  out, log = trained
  assert glob.glob(os.path.join(out, "model.ckpt-10.index"))
  assert "far_accuracy" in log and "near_accuracy" in log
  assert glob.glob(os.path.join(out, "eval*", "events.out.tfevents.*"))


def test_cpu_only_run_has_no_colocation_dump(trained):
  """Without a GPU the model is placed on the CPU: no soft-placement colocation warnings (T2T's
  default gpu:0 placement made TensorFlow print thousands of such lines per run)."""
  _, log = trained
  assert "Colocation Debug Info" not in log and "Failed to place the graph" not in log
  assert "Train." in log or "loss = " in log  # the log is the run's own (C++ warnings on)


def test_checkpoint_holds_centroids_that_moved(trained):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out, _ = trained
  reader = tf.train.load_checkpoint(os.path.join(out, "model.ckpt-10"))
  names = [n for n in reader.get_variable_to_shape_map() if n.endswith("cluster_attention/means")]
  assert names, "no centroid variables in the checkpoint"
  counts = reader.get_tensor(names[0].replace("/means", "/ema_count"))
  assert np.all(np.isfinite(counts)) and counts.sum() > 0  # EMA statistics were updated
  assert "sparse_transformer" not in names[0] and "routing_transformer/body" in names[0]


@pytest.mark.parametrize("args,message", [
    (["--hparams_set=no_such_set"], "unknown hparams set 'no_such_set'"),
    (["--hparams_set=routing_transformer_tiny", "--hparams=max_length=500,max_target_length=500"],
     "not a multiple of query_shape=64; use e.g. max_length=512"),
    (["--hparams_set=routing_transformer_tiny", "--hparams=sparsity_cluster_size=4"],
     "use sparsity_cluster_size >= 8"),
    (["--hparams_set=routing_transformer_tiny", "--hparams=local_num_heads=3"],
     "hidden_size=128 is not divisible by local_num_heads + sparsity_cluster_num_heads = 5"),
    (["--hparams_set=routing_transformer_tiny", "--hparams=sparsity_cluster_size=0"],
     "needs sparsity_cluster_size > 0"),
])
def test_bad_hparams_fail_fast_with_the_fix(data_dir, tmp_path, args, message):
  run = t2t("t2t-trainer", "--problem=synthetic_long_range", "--model=routing_transformer",
            "--data_dir=" + data_dir, "--output_dir=" + str(tmp_path), "--train_steps=1", *args,
            timeout=120)
  assert run.returncode != 0
  last = run.stderr.strip().splitlines()[-1]
  assert message in last and "Traceback" not in run.stderr
  assert not glob.glob(os.path.join(str(tmp_path), "model.ckpt*"))


@pytest.mark.parametrize("flags", [
    ["--use_tpu_estimator", "--iterations_per_loop=3", "--cloud_tpu_name=", "--schedule=train",
     "--hparams=tpu_enable_host_call=True"],
    ["--worker_gpu=2", "--schedule=train"],
    ["--xla_compile", "--schedule=train"],
], ids=["tpu_estimator", "worker_gpu2", "xla_compile"])
def test_distributed_paths_train(data_dir, tmp_path, flags):
  """TPUEstimator on the CPU, two data-parallel shards, and XLA: each trains and checkpoints."""
  out = str(tmp_path)
  run = t2t("t2t-trainer", "--problem=synthetic_long_range", "--model=routing_transformer",
            "--hparams_set=routing_transformer_tiny", "--data_dir=" + data_dir,
            "--output_dir=" + out, "--train_steps=3", *flags)
  assert run.returncode == 0, run.stderr[-4000:]
  assert glob.glob(os.path.join(out, "model.ckpt-3.index")), os.listdir(out)
  if "--worker_gpu=2" in flags:  # two shards, placed on the CPU (no GPU here)
    assert "No GPU visible: the 2 data shard(s) ['gpu:0', 'gpu:1']" in run.stderr
  if "--use_tpu_estimator" in flags:  # summaries came through TPUEstimator's host_call
    tags = _summary_tags(out)
    assert any("occupancy_entropy" in t for t in tags), sorted(tags)[:20]
    assert any("extra_loss" in t for t in tags), sorted(tags)[:20]


def _summary_tags(run_dir):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tags = set()
  for path in glob.glob(os.path.join(run_dir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(v.tag for v in event.summary.value)
  return tags


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
  assert words, "no prompt got a continuation"
  for word in words:  # every generated token decodes to a real synthetic token
    assert word != "<pad>" and synthetic.token_id(word) >= 0


@pytest.mark.parametrize("prompt_text,decode_hparams,message", [
    ("", "beam_size=1", "has no prompts"),
    (" ".join("f%d" % (i % 8) for i in range(513)), "beam_size=1",
     "the prompt is 513 tokens, longer than the model's max_target_length=512"),
    ("k1 v2", "beam_size=1,sampling_method=random,nucleus_sampling=1.5",
     "nucleus top-p must be in (0, 1]"),
    ("k1 v2", "beam_size=1,sampling_method=random,sampling_keep_top_k=-3", "top-k must be >= 0"),
], ids=["empty_file", "too_long", "bad_p", "bad_k"])
def test_decoder_rejects_bad_input_clearly(trained, data_dir, tmp_path, prompt_text,
                                           decode_hparams, message):
  prompts_file = str(tmp_path / "prompts.txt")
  with open(prompts_file, "w") as f:
    f.write(prompt_text)
  run = decode(trained[0], data_dir, prompts_file, str(tmp_path / "out.txt"), decode_hparams,
               timeout=120)
  assert run.returncode != 0
  assert message in run.stderr.strip().splitlines()[-1] and "Traceback" not in run.stderr


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


@pytest.mark.parametrize("args,message", [
    (["--problem=no_such_problem", "--model=routing_transformer"],
     "unknown problem 'no_such_problem'. This project's: cifar10_pixels"),
    (["--problem=synthetic_long_range", "--model=no_such_model"],
     "unknown model 'no_such_model'. This project's: routing_transformer"),
])
def test_unknown_names_fail_with_one_line(data_dir, tmp_path, args, message):
  run = t2t("t2t-trainer", "--hparams_set=routing_transformer_tiny", "--data_dir=" + data_dir,
            "--output_dir=" + str(tmp_path), "--train_steps=1", *args, timeout=120)
  assert run.returncode != 0
  assert message in run.stderr.strip().splitlines()[-1] and "Traceback" not in run.stderr


@pytest.mark.parametrize("problem,message", [
    ("synthetic_long_rnage", "unknown problem 'synthetic_long_rnage'. This project's: "),
    ("", "t2t-datagen needs --problem=NAME"),
], ids=["misspelt", "missing"])
def test_datagen_unknown_problem_fails_with_one_line(tmp_path, problem, message):
  """t2t-datagen names the bad problem in one line instead of listing every T2T problem."""
  data = tmp_path / "data"
  run = t2t("t2t-datagen", "--problem=" + problem, "--data_dir=%s" % data,
            "--tmp_dir=%s" % (tmp_path / "tmp"), timeout=120)
  assert run.returncode != 0
  last = run.stderr.strip().splitlines()[-1]
  assert last.startswith("error: " + message), last
  assert "synthetic_long_range" in last or not problem
  assert "Traceback" not in run.stderr and "TIMIT" not in run.stderr
  assert not data.exists()


def test_checkpoint_of_other_hparams_fails_listing_the_variables(trained, data_dir, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / "copy")
  shutil.copytree(trained[0], out)
  run = t2t("t2t-trainer", "--problem=synthetic_long_range", "--model=routing_transformer",
            "--hparams_set=routing_transformer_tiny", "--hparams=filter_size=128",
            "--data_dir=" + data_dir, "--output_dir=" + out, "--train_steps=12",
            "--schedule=train", timeout=300)
  assert run.returncode != 0 and "Traceback" not in run.stderr
  last = run.stderr.strip().splitlines()[-1]
  assert "does not fit this model" in last and "ffn/weight1/kernel (checkpoint [128, 256], " \
      "model [128, 128])" in last and "--hparams_set" in last
  assert not glob.glob(os.path.join(out, "model.ckpt-12.index"))
