# Quick start: `make demo` (set up the core, then generate with the embedded default model), `make test` (set up
# the core and the full environment, then test in both).
VENV := .venv/bin
CORE := .venv-core/bin
PROMPT ?= Write a Python function to find the largest element in a list.

.PHONY: setup setup-core demo test test-core test-full lint format sanitize

# .venv: the core, every extra but the cluster, the test and lint tools
setup:
	./scripts/setup.sh

# .venv-core: the core alone (what `pip install specwise` installs) and pytest
setup-core:
	./scripts/setup.sh core

demo: setup-core
	$(CORE)/specwise generate "$(PROMPT)" --max-new-tokens 128 --compare

# the suite on the core install for what differs without extras (import boundaries, the light tokenizers, the CLI
# and its messages naming missing extras, the GGUF path and the engine's requests), then the whole suite with every
# extra: every test runs at least once
CORE_TESTS := tests/test_imports.py tests/test_cli.py tests/test_tokenizer.py tests/test_gguf_tokenizer.py \
	tests/test_spm_tokenizer.py tests/test_models.py tests/test_bench.py tests/test_bench_workloads.py \
	tests/test_engine_requests.py tests/test_real_model.py
test: setup setup-core lint test-core test-full

# each run in worker processes (pytest-xdist), two by default (TEST_WORKERS=0: one process); each worker's native
# passes take its share of the cores (tests/conftest.py)
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist worksteal

test-core:
	$(CORE)/python -m pytest -q -p no:cacheprovider $(XDIST) $(CORE_TESTS)

test-full:
	$(VENV)/python -m pytest -q $(XDIST)

# the kernels built with AddressSanitizer and UndefinedBehaviorSanitizer, over the fuzz and kernel tests
sanitize: setup
	./scripts/sanitize.sh

lint: setup
	$(VENV)/ruff check specwise tests benchmarks
	$(VENV)/ruff format --check specwise tests benchmarks

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
