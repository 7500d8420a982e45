# The two Quickstart commands: `make reproduce` and `make test`. Both set everything up first.
PY ?= python3
OUT ?= results

.PHONY: setup reproduce test bench lint

setup:
	bash scripts/setup.sh

reproduce: setup
	attnprune reproduce synthetic --out $(OUT)

test: setup
	$(PY) -m pytest -q --durations=15

lint:
	ruff check attnprune tests scripts
