"""research/ investigations of the training step: matmul operand layouts (matmul_layouts.py) and
the step's memory and op-time breakdown (step_memory_breakdown.py)."""
import pytest
import tensorflow as tf

from conftest import research_module


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_layouts_benchmark_times_every_layout(dtype):
  """research/matmul_layouts.py (`make bench-matmul`) times the four layouts of one m x k x n
  product, each over its own operands of the right shapes (a transposed operand [n, k] or
  [k, m])."""
  matmul_layouts = research_module("matmul_layouts")
  with tf.Graph().as_default() as graph:
    fetches = matmul_layouts.layout_ops(8, 4, 2, dtype)
    products = {op.type for op in graph.get_operations()
                if op.type in ("MatMul", "BatchMatMulV2")}
  assert set(fetches) == set(matmul_layouts.LAYOUTS) and products == {"MatMul", "BatchMatMulV2"}
  assert all(t.dtype == dtype for t in fetches.values())
  m, k, n, seconds = matmul_layouts.time_layouts("8x4x2", 1, dtype)
  assert (m, k, n) == (8, 4, 2) and set(seconds) == set(matmul_layouts.LAYOUTS)
  assert all(s > 0 for s in seconds.values())




def test_memory_breakdown_labels_an_op_by_its_innermost_model_frame():
  """research/step_memory_breakdown.py names the part of the model an op belongs to from the
  innermost frame of PARTS, and the call chain below it (the kept tensors it counts:
  benchmarks/common.py kept_for_backward, tested in tests/test_step_memory.py)."""
  step_memory_breakdown = research_module("step_memory_breakdown")
  assert step_memory_breakdown.label_frames(
      [("common.py", "skew"), ("common.py", "relative_logits"), ("local.py", "local_attention"),
       ("heads.py", "local_heads_attention"), ("model.py", "block")]) == (
           "local heads", "skew < relative_logits")
  assert step_memory_breakdown.kept_for_backward is research_module("common").kept_for_backward


def test_memory_breakdown_sums_op_time_by_part_and_pass():
  """step_memory_breakdown.op_time_by_part: a node traced on two streams counts once (its
  longest span), a gradient op counts as backward for the part it differentiates, training/
  ops as the optimizer, and the op type comes from the timeline label."""
  from tensorflow.core.framework import step_stats_pb2  # pylint: disable=g-import-not-at-top
  step_memory_breakdown = research_module("step_memory_breakdown")
  stats = step_stats_pb2.StepStats()
  first, second = stats.dev_stats.add(device="cpu:0"), stats.dev_stats.add(device="cpu:0/stream")
  first.node_stats.add(node_name="ffn/w1/MatMul", all_end_rel_micros=3000,
                       timeline_label="ffn/w1/MatMul = _MklMatMul(x, w)")
  second.node_stats.add(node_name="ffn/w1/MatMul", all_end_rel_micros=2000,
                        timeline_label="ffn/w1/MatMul = _MklMatMul(x, w)")
  first.node_stats.add(node_name="gradients/ffn/w1/MatMul_grad/MatMul_1", all_end_rel_micros=5000,
                       op_end_rel_micros=6000,
                       timeline_label="gradients/ffn/w1/MatMul_grad/MatMul_1 = _MklMatMul(x, dy)")
  first.node_stats.add(node_name="ffn/gelu/mul", all_end_rel_micros=500,
                       timeline_label="ffn/gelu/mul = Mul(a, b)")
  first.node_stats.add(node_name="training/update_w1/mul", all_end_rel_micros=1500,
                       timeline_label="training/update_w1/mul = Mul(g, lr)")
  labeller = lambda name: (("optimizer", "adafactor", None) if name.startswith("training/")
                           else ("feed-forward", "geglu_ffn", 0))
  parts, rows = step_memory_breakdown.op_time_by_part(stats, labeller, top=10)
  assert parts == {"feed-forward": 9.5, "optimizer": 1.5}
  assert [(r["op_type"], r["pass"], r["nodes"], r["ms"]) for r in rows] == [
      ("_MklMatMul", "backward", 1, 6.0), ("_MklMatMul", "forward", 1, 3.0),
      ("Mul", "optimizer", 1, 1.5), ("Mul", "forward", 1, 0.5)]
  assert len(step_memory_breakdown.op_time_by_part(stats, labeller, top=2)[1]) == 2
