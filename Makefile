# The two Quickstart commands: `make reproduce` and `make test`. Both set everything up first.
PY ?= python3
OUT ?= results

.PHONY: setup reproduce test test-reverse bench lint

setup:
	bash scripts/setup.sh

reproduce: setup
	attnprune reproduce synthetic --out $(OUT)

# What CI runs (.ci/run is `make test`, then `make test-reverse`): CI=1 makes a missing ../shared data file or dev-extra
# module fail its test instead of skipping it (tests/conftest.py: require_shared_file,
# require_module); the hubs are unreachable offline, so nothing waits on them.
TEST_ENV = CI=1 MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1

test: setup
	$(TEST_ENV) $(PY) -m pytest -q --durations=15

# The suite again with its files in reverse order (order within a file kept; tests/conftest.py:
# pytest_collection_modifyitems), so a test that passes only after another file's lands red.
test-reverse: setup
	$(TEST_ENV) ATTNPRUNE_REVERSE_FILES=1 $(PY) -m pytest -q

lint:
	ruff check attnprune tests scripts
