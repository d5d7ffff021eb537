"""benchmarks/xla_memory.py reads XLA's own memory figure: the buffer assignment XLA's CPU
compiler dumps for a compiled function, parsed into its total and its parts, which grow with the
function's tensors and fall with a recomputation XLA keeps (tf.recompute_grad's); its
configurations set real hparams; its table compares them with plain routing."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, benchmark_module

xla_memory = benchmark_module("xla_memory")

# Two jit-compiled functions of x [n, 32] (n = 64 and 256) whose one large intermediate is the
# [n, n] float32 product, and the gradient of a chain of BLOCKS residual blocks over [1024, 128]
# without and with tf.recompute_grad (which keeps only each block's input for the backward
# pass, and makes XLA keep the recomputation with a data dependency on the incoming gradient);
# prints the parsed buffer assignment of each module XLA dumped.
BLOCKS = 6
SCRIPT = textwrap.dedent("""
    import json, os, sys
    dump = sys.argv[1]
    os.environ["XLA_FLAGS"] = (sys.argv[2] + " --xla_dump_to=%s --xla_dump_hlo_as_text" % dump)
    import tensorflow as tf
    import xla_memory

    def product_sum(x):
      return tf.reduce_sum(tf.tanh(tf.matmul(x, x, transpose_b=True)))

    small = tf.function(product_sum, jit_compile=True)
    large = tf.function(product_sum, jit_compile=True)
    print(small(tf.ones([64, 32])).numpy(), large(tf.ones([256, 32])).numpy())
    ws = [tf.Variable(tf.random.normal([128, 128], seed=i) * 0.05)
          for i in range(int(sys.argv[3]))]

    def block(x, w):
      return x + tf.tanh(tf.tanh(x @ w) @ tf.transpose(w))

    def chain_gradients(x, recompute):
      with tf.GradientTape() as tape:
        for w in ws:
          step = lambda x, w=w: block(x, w)
          x = tf.recompute_grad(step)(x) if recompute else step(x)
        loss = tf.reduce_sum(x * x)
      return tape.gradient(loss, ws)

    @tf.function(jit_compile=True)
    def chain_plain(x):
      return chain_gradients(x, False)

    @tf.function(jit_compile=True)
    def chain_recompute(x):
      return chain_gradients(x, True)
    x = tf.random.normal([1024, 128], seed=7)
    for got, want in zip(chain_recompute(x), chain_plain(x)):
      tf.debugging.assert_near(got, want, rtol=1e-4, atol=1e-5)
    print(json.dumps(xla_memory.dump_memory(dump)))
""")


def compiled_memory(tmp_path, flags=""):
  """{n: parsed buffer assignment} of product_sum compiled at x [n, 32] for n = 64 and 256, and
  {"plain" / "recompute": that} of the chain's gradients."""
  dump = str(tmp_path / ("dump" + str(len(flags))))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [os.path.join(ROOT, "benchmarks"), ROOT, os.environ.get("PYTHONPATH", "")]),
             TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run([sys.executable, "-c", SCRIPT, dump, flags, str(BLOCKS)],
                       capture_output=True, text=True, env=env, timeout=300, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.strip().splitlines()
  assert [float(v) for v in lines[0].split()] == [64.0 * 64, 256.0 * 256]  # tanh(32) = 1
  modules = json.loads(lines[-1])
  assert len(modules) == 4, [m["module"] for m in modules]
  products = [m for m in modules if "product_sum" in m["module"]]  # the larger first
  got = {256: products[0], 64: products[1]}
  for kind in ("plain", "recompute"):
    got[kind], = [m for m in modules if "chain_" + kind in m["module"]]
  return got


@pytest.fixture(scope="module")
def memory(tmp_path_factory):
  return compiled_memory(tmp_path_factory.mktemp("xla"))


def test_parsed_bytes_are_the_functions_buffers_and_grow_with_the_tensor(memory):
  for n in (64, 256):
    m = memory[n]
    assert m["parameter_bytes"] == 4 * n * 32  # x, float32
    assert m["output_bytes"] == 4  # the scalar sum
    assert 4 * n * n <= m["temp_bytes"] <= 3 * 4 * n * n  # the [n, n] product (and its tanh)
    assert m["total_bytes"] == sum(m[k + "_bytes"] for k in xla_memory.KINDS)
    assert m["allocations"] >= 3
    assert m["compile_seconds"] >= m["buffer_assignment_seconds"] >= 0
    assert m["hlo_dots_before"] == m["hlo_dots_after"] == 1  # the one matmul
    assert m["hlo_instructions_before"] > m["hlo_instructions_after"] >= 4
  grown = memory[256]["temp_bytes"] - memory[64]["temp_bytes"]
  assert grown >= 4 * (256 * 256 - 64 * 64)
  assert memory[256]["total_bytes"] > memory[64]["total_bytes"] + grown - 1


def test_llvm_flags_leave_the_buffer_assignment_alone(memory, tmp_path):
  """The benchmark compiles with LLVM's optimisations off (FAST_LLVM): XLA assigns the same
  buffers, so the bytes are those of a full compilation."""
  fast = compiled_memory(tmp_path, xla_memory.FAST_LLVM)
  keys = ["total_bytes"] + [k + "_bytes" for k in xla_memory.KINDS]
  for n in memory:
    assert {k: fast[n][k] for k in keys} == {k: memory[n][k] for k in keys}, n


def test_a_recomputation_xla_keeps_shows_in_the_bytes_and_the_dots(memory):
  """tf.recompute_grad's chain: fewer temporary bytes than the plain chain's (its activations
  are not all kept for the backward pass), and each block's forward matmuls run again (two more
  dots per block after XLA's passes); the same parameters and outputs."""
  plain, recompute = memory["plain"], memory["recompute"]
  activation = 1024 * 128 * 4
  assert recompute["temp_bytes"] <= plain["temp_bytes"] - BLOCKS * activation
  assert recompute["hlo_dots_after"] == plain["hlo_dots_after"] + 2 * BLOCKS
  # 2 forward and 4 backward matmuls per block, less the first block's gradient of x (unused)
  assert plain["hlo_dots_after"] == 6 * BLOCKS - 1
  weights = BLOCKS * 128 * 128 * 4
  assert recompute["parameter_bytes"] == plain["parameter_bytes"] == weights + activation  # x
  # The weights' gradients and the output tuple (a pointer to each).
  assert recompute["output_bytes"] == plain["output_bytes"] == weights + 8 * BLOCKS


ASSIGNMENT = """BufferAssignment:
allocation 0: size 8192, parameter 0, shape |f32[64,32]| at ShapeIndex {}:
 value: <3 arg0.1 @0> (size=8192,offset=0): f32[64,32]{1,0}
allocation 1: size 512, maybe-live-out, parameter 1, shape |f32[128]| at ShapeIndex {}:
allocation 2: size 4, output shape is |f32[]|, maybe-live-out:
allocation 3: size 4, constant:
allocation 4: size 8, thread-local:
allocation 5: size 16400, preallocated-temp:
 value: <4 dot.4 @0> (size=16384,offset=0): f32[64,64]{1,0}
allocation 6: size 100:

Total bytes used: 25220 (24.6KiB)

Used values:
allocation 7: size 999, constant:
"""


def test_parse_splits_the_total_by_kind():
  parsed = xla_memory.parse_buffer_assignment(ASSIGNMENT)
  assert parsed == {"total_bytes": 25220, "allocations": 7, "parameter_bytes": 8704,
                    "output_bytes": 4, "constant_bytes": 4, "thread_local_bytes": 8,
                    "temp_bytes": 16500}
  with pytest.raises(ValueError, match="add up to 25219"):
    xla_memory.parse_buffer_assignment(ASSIGNMENT.replace("size 100:", "size 99:"))
  with pytest.raises(ValueError, match="Total bytes used"):
    xla_memory.parse_buffer_assignment(ASSIGNMENT.split("\nTotal")[0])


def test_configurations_set_existing_hparams():
  """Each configuration's overrides name hparams of the bench-8k set (setattr on HParams would
  add a new, unread attribute silently), with values of their types."""
  train_step = benchmark_module("train_step")
  train_memory = benchmark_module("train_memory")
  plain = train_step.model_hparams("routing", 1024).values()
  assert list(xla_memory.CONFIGS) == [
      "routing", "routing_attention_recompute", "routing_recompute", "routing_chunked",
      "routing_ffn_chunked", "routing_recompute_ffn_chunked",
      "routing_recompute_attention_ffn_chunked", "routing_recompute_chunked_attention",
      "routing_bf16"]
  assert xla_memory.CONFIGS == train_memory.CONFIGS
  assert benchmark_module("peers").OURS == {
      name: ("routing", train_memory.overrides_of(name, 1024)) for name in xla_memory.CONFIGS}
  assert benchmark_module("peers").OURS["routing_ffn_chunked"][1] == {"ffn_chunk_size": 2048}
  for name in xla_memory.CONFIGS:
    overrides = train_memory.overrides_of(name, 512)
    for key, value in overrides.items():
      assert key in plain, (name, key)
      assert isinstance(value, type(plain[key])), (name, key, value)
    assert xla_memory.CONFIGS[name][0] in train_step.KINDS
  assert train_memory.overrides_of("routing_chunked", 512) == {"logits_chunk_size": 512}
  assert train_memory.overrides_of("routing_recompute_chunked_attention", 512) == {
      "recompute_layers": True, "recompute_attention": True, "logits_chunk_size": 512,
      "ffn_chunk_size": 2048}  # a quarter of bench-8k's length
  assert train_memory.overrides_of("routing_ffn_chunked", 512, length=1024) == {
      "ffn_chunk_size": 256}


def test_the_switch_table_gives_each_peak_over_the_plain_steps_and_the_ports():
  common = benchmark_module("common")
  lines = common.switch_table({"routing": 2048.0, "routing_recompute": 1536.0}, port_mb=4096.0)
  rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in lines
          if line.startswith("| routing")}
  assert rows["routing"] == ["(plain)", "2.00 GiB", "1.00", "0.50 |"]
  assert rows["routing_recompute"] == ["recompute_layers=True", "1.50 GiB", "0.75", "0.38 |"]
  assert common.switch_table({"routing_recompute": 1536.0})[-1].endswith("| - | - |")


def test_train_memory_reads_the_ports_peak_from_the_peers_results(tmp_path):
  train_memory = benchmark_module("train_memory")
  path = tmp_path / "peers.json"
  path.write_text(json.dumps({"machine": {"length": 8192, "date": "2026-12-01"},
                              "peer": {"peak_rss_mb": 3000.0}}))
  assert train_memory.port_peak(str(path), 256)[0] == 3000.0
  path.write_text(json.dumps({"machine": {"length": 1024}, "peer": {"peak_rss_mb": 3.0}}))
  assert train_memory.port_peak(str(path), 256) == (None, "%s measured length 1024" % path)
  assert "make bench-peers" in train_memory.port_peak(str(tmp_path / "no.json"), 256)[1]


def point(total, temp, allocations=10):
  """A configuration's record with `total` and `temp` MiB, 100 MiB of parameters."""
  mib = 2 ** 20
  return {"status": "ok", "total_bytes": total * mib, "temp_bytes": temp * mib,
          "allocations": allocations, "parameter_bytes": 100 * mib,
          "output_bytes": (total - temp - 100) * mib, "constant_bytes": 0,
          "thread_local_bytes": 0, "compile_seconds": 3.0, "hlo_dots_before": 12,
          "hlo_dots_after": 8}


def test_ratios_and_table_against_plain_routing_with_the_executors_peaks(tmp_path, capsys):
  results = {"routing": point(1000, 800), "routing_recompute": point(1000, 800),
             "routing_chunked": point(1000, 800, allocations=11), "routing_bf16": point(600, 400),
             "routing_attention_recompute": {"status": "failed"},
             "routing_recompute_chunked_attention": dict(point(900, 700),
                                                         compiled="loss and gradients")}
  path = tmp_path / "train_memory.json"
  path.write_text(json.dumps({"machine": {"date": "2026-12-01", "vocab": 256, "chunk": 1024},
                              "bench_8k": {"routing": {"status": "ok", "peak_rss_mb": 2048.0},
                                           "routing_recompute": {"status": "ok",
                                                                 "peak_rss_mb": 1536.0},
                                           "routing_bf16": {"status": "timeout"}}}))
  executor, machine, why_not = xla_memory.executor_peaks(str(path), 256, 1024)
  assert executor == {"routing": 2048.0, "routing_recompute": 1536.0} and why_not is None
  assert machine["date"] == "2026-12-01"
  assert xla_memory.executor_peaks(str(path), 256, 512)[2].endswith("chunk 1024, not 256, 512")
  assert "make bench-memory" in xla_memory.executor_peaks(str(tmp_path / "no.json"), 256, 1)[2]
  ratio = xla_memory.ratios(results, executor)
  assert ratio["xla_total_routing_bf16_over_routing"] == 0.6
  assert ratio["xla_temp_routing_bf16_over_routing"] == 0.5
  assert ratio["executor_peak_rss_routing_recompute_over_routing"] == 0.75
  assert not any("attention" in key for key in ratio)  # failed; not a whole step
  xla_memory.print_table(results, executor, "a file", 8192)
  rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:]
          for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
  assert rows["routing_recompute"][:8] == ["1000 MiB", "1 (=)", "800 MiB", "1 (=)", "100 MiB",
                                          "100 MiB", "12 / 8", "3 s"]
  assert rows["routing"][1] == "1"
  assert rows["routing_recompute"][-2:] == ["1.50 GiB", "0.75 |"]
  assert rows["routing_chunked"][1] == "1.00" and rows["routing_bf16"][3] == "0.50"
  assert rows["routing_attention_recompute"][0] == "failed"
  assert rows["routing_recompute_chunked_attention (loss and gradients)"][:2] == ["900 MiB", "-"]
