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

# the suite twice: on the core alone (tests that need an extra are skipped, with the extra named), then with every
# extra
test: setup setup-core lint test-core test-full

test-core:
	$(CORE)/python -m pytest -q -p no:cacheprovider

test-full:
	$(VENV)/python -m pytest -q

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
