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
