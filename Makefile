# Quick start: `make demo` (set up, then generate with the embedded default model), `make test` (set up, then test).
VENV := .venv/bin
PROMPT ?= Name three primary colors.

.PHONY: setup demo test lint format sanitize

setup:
	./scripts/setup.sh

demo: setup
	$(VENV)/specwise generate "$(PROMPT)" --max-new-tokens 128

test: setup
	$(VENV)/ruff check specwise tests benchmarks
	$(VENV)/ruff format --check specwise tests benchmarks
	$(VENV)/python -m pytest -q

# the kernels built with AddressSanitizer and UndefinedBehaviorSanitizer, over the fuzz and kernel tests
sanitize: setup
	./scripts/sanitize.sh

lint:
	$(VENV)/ruff check specwise tests benchmarks

format:
	$(VENV)/ruff format specwise tests benchmarks
	$(VENV)/ruff check --fix specwise tests benchmarks

# Ray Serve for `specwise serve --ray` (the [cluster] extra, docs/SCALING.md): not in `make setup`, so that `make test`
# and CI do not install it
.PHONY: setup-cluster test-cluster
setup-cluster: setup
	$(VENV)/pip install -q -c constraints.txt -e ".[cluster]"

# the cluster tests: a two-node Ray cluster on this machine (loopback only), torn down at the end
test-cluster: setup-cluster
	$(VENV)/python -m pytest -q tests/test_cluster.py
