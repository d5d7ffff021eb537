"""Where a training step's peak memory goes (bench-8k): baseline, kept tensors, transients.

    python research/step_memory_breakdown.py [--model routing] [--length 8192]
        [--overrides JSON] [--vocab 256] [--top 12] [--threads N] [--no_trace] [--out DIR]

One process (bench-8k routing: about 5 GB and 2 minutes on 2 cores) builds the training step of
benchmarks/train_step.py (model, loss, Adafactor through T2T's optimizer code; --overrides sets
hparams on top, e.g. '{"recompute_layers": true}') and reports:

(a) Baseline: the resident set size (VmRSS) after importing TensorFlow, after importing T2T and
    the model, and after building the step and initialising its variables, before any step; and
    the bytes TF's allocator holds then (variables, optimizer slots).
(b) Kept: the forward tensors the gradient ops read, i.e. what the forward pass keeps alive for
    the backward pass, read off the graph: every input of a gradient op that the step runs (ops
    the training op does not need are pruned) produced by a forward op, followed through views
    (Identity, Reshape, ...) to its buffer and summed in bytes from static shapes (variables and
    constants apart). Grouped by what produced them: the part of the model, read from the Python
    stack that created the op (local heads, routing heads, q/k/v projections, attention output,
    GEGLU, LayerNorm + residual, embedding, logits + loss, k-means, optimizer), the innermost
    functions of ours or of T2T that created it (e.g. `skew < relative_logits`,
    `layer_norm_compute < layer_norm`) and the op type; largest first; with sums per part and per
    layer.
(c) Peak: the peak RSS (VmHWM) of the first step, and of a second step alone (the peak is reset
    through /proc/self/clear_refs before it), the peak bytes TF's allocator held during the
    second step (BFC statistics: TF_CPU_ALLOCATOR_USE_BFC, set by the benchmarks), and the split
    peak RSS - baseline = kept + transient (tensors alive only around the peak: gradients and the
    temporaries of the backward ops) + slack (RSS beyond the allocator's peak bytes in use).
(d) Unless --no_trace: a third step traced with TF's RunMetadata (per-node times and output
    buffers, on the graph the executor ran after Grappler) replayed as allocations and frees:
    the bytes alive at the replay's peak, grouped as in (b), forward (kept) and backward
    (transient) apart. An output that aliases one of its node's input buffers (forwarded, a
    view) counts once; a buffer lives from its producer's start to its last consumer's end;
    variables and constants are left out. The same trace's op time, summed by part of the
    model (a gradient op counted for the part it differentiates) and by part, creating
    function, op type and pass: where the step's time goes.

Prints the tables and one JSON line per record; writes
research/results/step_memory_breakdown.json. Run it alone (it measures RSS).
"""
import argparse
import collections
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))  # the suite's helpers
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

MIB = 2.0 ** 20
GIB = 2.0 ** 30
GRADIENT, VIEWS, PERSISTENT = common.GRADIENT, common.VIEWS, common.PERSISTENT
FORWARD_OF_GRADIENT = re.compile(r"^(?:.*/)?gradients(?:_\d+)?/(.*?)_grad/")
# (file name, function) of the Python stack -> part of the model; the innermost match wins.
PARTS = {
    ("heads.py", "local_heads_attention"): "local heads",
    ("heads.py", "routing_heads_attention"): "routing heads",
    ("layers.py", "projections"): "q/k/v projections",
    ("layers.py", "attention_output"): "attention output",
    ("heads.py", "kind_heads"): "attention output",  # the heads' output, rejoined
    ("layers.py", "ffn"): "feed-forward (GEGLU)",
    ("layers.py", "geglu_ffn"): "feed-forward (GEGLU)",
    ("layers.py", "geglu_output"): "feed-forward (GEGLU)",
    ("model.py", "postprocess"): "LayerNorm + residual",
    ("model.py", "preprocess"): "LayerNorm + residual",
    ("model.py", "embed"): "embedding",
    ("chunked_loss.py", None): "logits + loss",
    ("kmeans.py", None): "k-means",
    ("routing.py", "routing_statistics"): "k-means",
    ("t2t_model.py", None): "logits + loss",
    ("optimize.py", None): "optimizer",
    ("adafactor.py", None): "optimizer",
}
OURS = ("routing_transformer", "tensor2tensor")  # package directories whose frames label ops


# --- process memory ------------------------------------------------------------------------------

def status_bytes(field):
  """A field of /proc/self/status (VmRSS, VmHWM) in bytes; 0 where unreadable."""
  return common.proc_status_kib(field) * 1024


def reset_peak_rss():
  """Resets VmHWM to the current RSS (Linux: 5 > /proc/self/clear_refs); False where refused."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def allocator_bytes(key):
  """TF's CPU allocator statistic ("current" or "peak" bytes in use), None without BFC stats."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    return tf.config.experimental.get_memory_info("CPU:0")[key]
  except (ValueError, RuntimeError, KeyError):
    return None


def reset_allocator_peak():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    tf.config.experimental.reset_memory_stats("CPU:0")
  except (ValueError, RuntimeError):
    pass


# --- labels: what created an op ------------------------------------------------------------------

def frames_of(op):
  """[(file name, function)] of the Python stack that created `op` within routing_transformer/
  and tensor2tensor/, innermost first."""
  try:
    stack = list(op.traceback)
  except Exception:  # pylint: disable=broad-except
    return []
  out = []
  for frame in reversed(stack):  # the stack is outermost first
    filename = getattr(frame, "filename", None) or frame[0]
    name = getattr(frame, "name", None) or frame[2]
    parts = filename.replace("\\", "/").split("/")
    if any(p in OURS for p in parts[:-1]) and not any(p in ("tensorflow", "keras")
                                                      for p in parts[:-1]):
      out.append((parts[-1], name))
  return out


def label_frames(frames):
  """(part, created by) of an op from its frames (innermost first): the innermost frame of PARTS
  gives the part (else the innermost frame's file:function), the two innermost functions say
  what created it ("inner < caller")."""
  part = None
  for filename, function in frames:
    part = PARTS.get((filename, function)) or PARTS.get((filename, None))
    if part:
      break
  if part is None:
    part = "%s:%s" % frames[0] if frames else "other"
  names = []
  for _, function in frames:
    if function not in names and not function.startswith("<"):
      names.append(function)
    if len(names) == 2:
      break
  return part, " < ".join(names) or "-"


class Labeller(object):
  """Labels of ops by name (cached): (part, created by, layer), a gradient op labelled as the
  forward op whose gradient it computes."""

  def __init__(self, graph):
    self.graph = graph
    self.cache = {}

  def op(self, name):
    try:
      return self.graph.get_operation_by_name(name)
    except (KeyError, ValueError):
      return None

  def __call__(self, name):
    if name in self.cache:
      return self.cache[name]
    forward = FORWARD_OF_GRADIENT.match(name)
    target = forward.group(1) if forward else name
    op = self.op(target)
    while op is None and "/" in target:  # a node Grappler made: its nearest named ancestor scope
      target = target.rsplit("/", 1)[0]
      op = self.op(target)
    part, created = label_frames(frames_of(op)) if op is not None else ("other", "-")
    layer = re.search(r"(?:decoder|encoder)_layer_(\d+)", name)
    label = (part, created, int(layer.group(1)) if layer else None)
    self.cache[name] = label
    return label


# --- (b) what the backward pass reads: benchmarks/common.py (the tests use it too) ----------------

needed_ops, buffer_of, tensor_bytes = common.needed_ops, common.buffer_of, common.tensor_bytes
kept_for_backward = common.kept_for_backward


def group(items, labeller, top):
  """items: [(op name, op type, bytes, shape)] -> rows (part, created by, op type, count, bytes,
  largest shape) largest first (the first `top`), {part: bytes}, {layer: bytes}."""
  rows = collections.defaultdict(lambda: [0, 0, 0, None])
  parts, layers = collections.Counter(), collections.Counter()
  for name, op_type, nbytes, shape in items:
    part, created, layer = labeller(name)
    row = rows[(part, created, op_type)]
    row[0] += 1
    row[1] += nbytes
    if nbytes > row[2]:
      row[2], row[3] = nbytes, shape
    parts[part] += nbytes
    layers["layer %d" % layer if layer is not None else "outside the layers"] += nbytes
  ordered = sorted(rows.items(), key=lambda kv: -kv[1][1])
  table = [{"part": k[0], "created_by": k[1], "op_type": k[2], "tensors": v[0],
            "mib": v[1] / MIB, "largest_shape": v[3]} for k, v in ordered[:top]]
  return table, {k: v / MIB for k, v in parts.most_common()}, \
      {k: v / MIB for k, v in sorted(layers.items())}


# --- (d) a traced step replayed as allocations and frees -----------------------------------------

def parse_input(name):
  """A NodeDef input "node:slot" / "node" / "^node" -> (node, slot) or None for control."""
  if name.startswith("^"):
    return None
  node, _, slot = name.rpartition(":")
  if node and slot.isdigit():
    return node, int(slot)
  return name, 0


def replay(step_stats, graph_defs):
  """Buffers of a traced step: [(alloc micros, free micros, bytes, producer node, producer op
  type)], from the output allocations of every node and the consumers in the executed graphs."""
  node_defs = {n.name: n for g in graph_defs for n in g.node}
  consumers = collections.defaultdict(list)
  inputs = collections.defaultdict(list)
  for node in node_defs.values():
    for name in node.input:
      source = parse_input(name)
      if source is not None:
        consumers[source].append(node.name)
        inputs[node.name].append(source)
  times, outputs = {}, {}
  for dev in step_stats.dev_stats:
    for ns in dev.node_stats:
      end = ns.all_start_micros + max(ns.all_end_rel_micros, ns.op_end_rel_micros)
      start = ns.all_start_micros
      if ns.node_name in times:  # the same node on another stream: widest span
        start, end = min(start, times[ns.node_name][0]), max(end, times[ns.node_name][1])
      times[ns.node_name] = (start, end)
      for o in ns.output:
        a = o.tensor_description.allocation_description
        outputs.setdefault(ns.node_name, []).append((o.slot, a.requested_bytes, a.ptr))
  buffers, of_tensor = [], {}
  for name in sorted(outputs, key=lambda n: times[n][0]):
    op_type = node_defs[name].op if name in node_defs else "?"
    aliases = {}
    for source in inputs.get(name, ()):
      b = of_tensor.get(source)
      if b is not None and buffers[b]["ptr"]:
        aliases[buffers[b]["ptr"]] = b
    for slot, nbytes, ptr in outputs[name]:
      if nbytes <= 0:
        continue
      if ptr and ptr in aliases:
        b = aliases[ptr]
      else:
        b = len(buffers)
        buffers.append({"alloc": times[name][0], "free": times[name][1], "bytes": nbytes,
                        "ptr": ptr, "node": name, "op_type": op_type,
                        "persistent": op_type in PERSISTENT})
      of_tensor[(name, slot)] = b
  for (name, slot), b in of_tensor.items():
    for consumer in consumers.get((name, slot), ()):
      if consumer in times:
        buffers[b]["free"] = max(buffers[b]["free"], times[consumer][1])
  return [b for b in buffers if not b["persistent"]]


def op_time_by_part(step_stats, labeller, top):
  """Summed op time (ms) of a traced step: ({part: ms}, rows (part, created by, op type, pass,
  nodes, ms) largest first, the first `top`). A gradient op counts for the part whose forward op
  it differentiates; pass is forward, backward or optimizer. Independent ops run side by side,
  so the sums exceed wall time."""
  node_ms, node_op = {}, {}
  for dev in step_stats.dev_stats:
    for ns in dev.node_stats:
      ms = max(ns.all_end_rel_micros, ns.op_end_rel_micros) / 1000.0
      node_ms[ns.node_name] = max(ms, node_ms.get(ns.node_name, 0.0))  # once per node
      label = ns.timeline_label
      node_op[ns.node_name] = (label.split("(")[0].split("= ")[-1].strip() if label else "?")
  parts, rows = collections.Counter(), collections.defaultdict(lambda: [0, 0.0])
  for name, ms in node_ms.items():
    part, created, _ = labeller(name)
    phase = ("backward" if GRADIENT.search(name) else
             "optimizer" if name.startswith("training/") else "forward")
    parts[part] += ms
    row = rows[(part, created, node_op[name], phase)]
    row[0] += 1
    row[1] += ms
  ordered = sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]
  return ({k: round(v, 1) for k, v in parts.most_common()},
          [{"part": k[0], "created_by": k[1], "op_type": k[2], "pass": k[3], "nodes": v[0],
            "ms": round(v[1], 1)} for k, v in ordered])


def live_at_peak(buffers):
  """(peak bytes, peak micros, [buffers alive then]) of the replay (frees before allocations
  at equal times)."""
  events = sorted([(b["alloc"], 1, b["bytes"]) for b in buffers] +
                  [(b["free"], 0, -b["bytes"]) for b in buffers])
  live = peak = 0
  when = None
  for t, _, delta in events:
    live += delta
    if live > peak:
      peak, when = live, t
  alive = [b for b in buffers if b["alloc"] <= when < b["free"]] if when is not None else []
  return peak, when, alive


# --- the run -------------------------------------------------------------------------------------

def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="routing")
  parser.add_argument("--length", type=int, default=8192)
  parser.add_argument("--overrides", default="{}", help="JSON {hparam: value} set on top")
  parser.add_argument("--vocab", type=int, default=256)
  parser.add_argument("--top", type=int, default=12, help="rows of the grouped tables")
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  parser.add_argument("--no_trace", action="store_true", help="skip (d), the traced step")
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  args = parser.parse_args(argv)
  overrides = json.loads(args.overrides)
  rss = {"start": status_bytes("VmRSS")}
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  rss["import_tensorflow"] = status_bytes("VmRSS")
  info = common.start("step_memory_breakdown", model=args.model, length=args.length,
                      overrides=overrides, vocab=args.vocab, threads_used=args.threads)
  tf.config.threading.set_intra_op_parallelism_threads(args.threads)
  # pylint: disable=g-import-not-at-top,unused-import,reimported
  import train_step
  from routing_transformer.t2t import model as _
  from tensor2tensor.utils import optimize as _
  # pylint: enable=g-import-not-at-top,unused-import,reimported
  rss["import_t2t_and_model"] = status_bytes("VmRSS")
  started = time.perf_counter()
  run, params = train_step.build_train_step(args.model, args.length, overrides, args.vocab)
  build_seconds = time.perf_counter() - started
  rss["baseline"] = status_bytes("VmRSS")  # graph built, variables initialised
  rss["peak_before_step"] = status_bytes("VmHWM")
  in_use_before = allocator_bytes("current")

  kept, persistent_read, unknown = kept_for_backward(run.graph, run.fetches)
  labeller = Labeller(run.graph)
  kept_items = [(name, op_type, n, shape) for n, name, op_type, shape in kept.values()]
  kept_total = sum(item[2] for item in kept_items)
  kept_table, kept_parts, kept_layers = group(kept_items, labeller, args.top)

  started = time.perf_counter()
  run()
  first_seconds = time.perf_counter() - started
  rss["peak_first_step"] = status_bytes("VmHWM")
  reset = reset_peak_rss()
  reset_allocator_peak()
  started = time.perf_counter()
  run()
  second_seconds = time.perf_counter() - started
  rss["peak_second_step"] = status_bytes("VmHWM") if reset else None
  allocator_peak = allocator_bytes("peak")
  tensor_peak = (allocator_peak - in_use_before
                 if allocator_peak is not None and in_use_before is not None else None)
  peak = rss["peak_second_step"] or rss["peak_first_step"]
  above = peak - rss["baseline"]
  split = {"peak_rss_over_baseline_mib": above / MIB, "kept_mib": kept_total / MIB,
           "transient_and_slack_mib": (above - kept_total) / MIB,
           "allocator_in_use_before_step_mib": (in_use_before or 0) / MIB,
           "allocator_step_peak_mib": tensor_peak / MIB if tensor_peak is not None else None,
           "transient_mib": (tensor_peak - kept_total) / MIB if tensor_peak is not None else None,
           "slack_mib": (above - tensor_peak) / MIB if tensor_peak is not None else None,
           "persistent_read_by_gradients_mib": persistent_read / MIB,
           "kept_without_static_shape": unknown}
  record = {"record": "breakdown", "model": args.model, "length": args.length,
            "overrides": overrides, "parameters": params, "graph_build_seconds": build_seconds,
            "first_step_seconds": first_seconds, "second_step_seconds": second_seconds,
            "rss_mib": {k: (v / MIB if v is not None else None) for k, v in rss.items()},
            "split": split, "kept_by_part_mib": kept_parts, "kept_by_layer_mib": kept_layers,
            "kept_top": kept_table}

  if not args.no_trace:
    metadata = tf1.RunMetadata()
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True)
    run(options=options, run_metadata=metadata)
    buffers = replay(metadata.step_stats, metadata.partition_graphs)
    replay_peak, _, alive = live_at_peak(buffers)
    items = [(b["node"], b["op_type"], b["bytes"], None) for b in alive]
    forward = [i for i in items if not GRADIENT.search(i[0])]
    backward = [i for i in items if GRADIENT.search(i[0])]
    record["trace"] = {
        "replay_peak_mib": replay_peak / MIB, "buffers": len(buffers),
        "forward_alive_mib": sum(i[2] for i in forward) / MIB,
        "backward_alive_mib": sum(i[2] for i in backward) / MIB,
        "forward_top": group(forward, labeller, args.top)[0],
        "backward_top": group(backward, labeller, args.top)[0],
        "alive_by_part_mib": group(items, labeller, args.top)[1]}
    time_parts, time_rows = op_time_by_part(metadata.step_stats, labeller, 2 * args.top)
    record["trace"].update({"op_ms_total": round(sum(time_parts.values()), 1),
                            "op_ms_by_part": time_parts, "op_ms_top": time_rows})
  common.emit(record)
  print_tables(info, record)
  common.save(args.out, "step_memory_breakdown.json", {"machine": info, "breakdown": record})


def print_tables(info, r):
  rss, split = r["rss_mib"], r["split"]
  gib = lambda mib: "-" if mib is None else "%.2f GiB" % (mib / 1024.0)
  print("\n%s, %d threads, %s; %s at length %d %s\n" % (
      info["cpu_model"], info["threads_used"], info["date"], r["model"], r["length"],
      json.dumps(r["overrides"]) if r["overrides"] else ""))
  print("| measure | |\n|---|---|")
  for label, value in [
      ("RSS after importing TensorFlow", rss["import_tensorflow"]),
      ("RSS after importing T2T and the model", rss["import_t2t_and_model"]),
      ("RSS after building the step, variables initialised (baseline)", rss["baseline"]),
      ("TF allocator in use then (variables, slots)", split["allocator_in_use_before_step_mib"]),
      ("peak RSS, first step", rss["peak_first_step"]),
      ("peak RSS, second step", rss["peak_second_step"]),
      ("peak RSS - baseline", split["peak_rss_over_baseline_mib"]),
      ("kept for the backward pass (graph, static shapes)", split["kept_mib"]),
      ("TF allocator peak in the second step, above the baseline",
       split["allocator_step_peak_mib"]),
      ("transient (allocator peak - kept)", split["transient_mib"]),
      ("slack (peak RSS - baseline - allocator peak)", split["slack_mib"])]:
    print("| %s | %s |" % (label, gib(value)))
  print("\nkept by part: " + ", ".join("%s %.0f MiB" % kv for kv in r["kept_by_part_mib"].items()))
  print("kept by layer: " + ", ".join("%s %.0f MiB" % kv for kv in r["kept_by_layer_mib"].items()))
  tables = [("kept for the backward pass", r["kept_top"])]
  if "trace" in r:
    t = r["trace"]
    print("\ntraced step replayed: peak %.0f MiB (forward tensors alive %.0f MiB, backward %.0f "
          "MiB)" % (t["replay_peak_mib"], t["forward_alive_mib"], t["backward_alive_mib"]))
    tables += [("alive at the replayed peak, forward", t["forward_top"]),
               ("alive at the replayed peak, backward", t["backward_top"])]
  if "trace" in r:
    t = r["trace"]
    print("\ntraced step, summed op time %.0f ms (ops run side by side: above wall time), by "
          "part: %s" % (t["op_ms_total"], ", ".join("%s %.0f" % kv
                                                      for kv in t["op_ms_by_part"].items())))
    print("\n| part | created by | op | pass | nodes | ms | share |\n|---|---|---|---|---|---|---|")
    for row in t["op_ms_top"]:
      print("| %s | %s | %s | %s | %d | %.0f | %.3f |" % (
          row["part"], row["created_by"], row["op_type"], row["pass"], row["nodes"], row["ms"],
          row["ms"] / t["op_ms_total"]))
  for title, rows in tables:
    print("\n%s:\n\n| part | created by | op | tensors | MiB | largest |\n|---|---|---|---|---|---|"
          % title)
    for row in rows:
      print("| %s | %s | %s | %d | %.0f | %s |" % (row["part"], row["created_by"], row["op_type"],
                                                 row["tensors"], row["mib"],
                                                 row["largest_shape"] or ""))


if __name__ == "__main__":
  common.ensure_bench_env()
  main()
