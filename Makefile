# The two Quickstart commands: `make reproduce` and `make test`. Both set everything up first.
PY ?= python3
OUT ?= results

.PHONY: setup reproduce test test-reverse test-fake-exporting bench lint

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

# The compile, export and ONNX tests again with torch 2.11's faked torch.compiler.is_exporting()
# (dynamo answers True inside any compile; the GPU image's torch): tests/conftest.py,
# install_fake_exporting. The encoder host must not take its export path under torch.compile
# (issue 46, item 2). `-k compile` selects all of tests/test_compiled.py by its name.
FAKE_EXPORTING_TESTS = tests/test_export_flag.py tests/test_compiled.py tests/test_sync_free.py \
	tests/test_merge.py tests/test_onnx.py tests/test_compiled_sdpa_mask.py

test-fake-exporting: setup
	$(TEST_ENV) ATTNPRUNE_FAKE_EXPORTING=1 $(PY) -m pytest -q $(FAKE_EXPORTING_TESTS) \
		-k "compile or export or onnx or fake"

lint:
	ruff check attnprune tests scripts
