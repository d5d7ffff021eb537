# Entry points. Every target sets up .venv first when needed (scripts/setup.sh is idempotent).
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup test test-fast bench-attention demo clean

setup:
	@bash scripts/setup.sh

test: setup
	$(PY) -m pytest -q tests $(PYTEST_ARGS)

bench-attention: setup
	$(PY) benchmarks/attention.py

clean:
	rm -rf .pytest_cache benchmarks/results
