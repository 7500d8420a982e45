"""export_onnx is quiet (issue 48, item 5): torch's exporter's known-harmless warnings
(torchvision not installed, merged axis names, its own pytree deprecation: seven lines a new
user read as errors) go to attnprune's debug log, inside the export only; other warnings are
still shown, errors still raised. ``single_file=True`` keeps the weights in the .onnx file."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from conftest import require_module  # tests/ is on sys.path
from transformers import BertConfig, BertForSequenceClassification

import attnprune
from attnprune.deploy import onnx as onnx_mod

REGISTRATION = "torch.onnx._internal.exporter._registration"


def tiny():
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64)).eval()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def torch_log():
    """What torch's exporter logs past its loggers' filters (its own handler prints it)."""
    handler, logger = _Records(), logging.getLogger(REGISTRATION)
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)


def test_a_real_export_shows_no_warning(tmp_path, recwarn, torch_log, caplog):
    for name in ("onnxruntime", "onnxscript", "onnx"):
        require_module(name)
    model = attnprune.patch(tiny(), "attention_mass", keep_ratio=0.5)
    with caplog.at_level(logging.DEBUG, logger="attnprune.deploy.onnx"):
        onnx_mod.export_onnx(model, tmp_path / "m.onnx")  # verified in onnxruntime
    # was: 3 warnings (a FutureWarning, 2 UserWarnings) and 4 "torchvision is not installed"
    assert [str(w.message) for w in recwarn] == []
    assert [r.getMessage() for r in torch_log if r.levelno >= logging.WARNING] == []
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "torchvision is not installed" in logged and "axis name" in logged
    assert logging.getLogger(REGISTRATION).filters == []  # scoped: nothing left behind
    assert (tmp_path / "m.onnx.data").is_file()  # the default: weights beside the graph


def _fake_export(*args, **kwargs):
    """Stands in for torch.onnx.export: the exporter's harmless noise and one real warning."""
    logging.getLogger(REGISTRATION).warning("torchvision is not installed. Skipping %s",
                                            "torchvision::nms")
    logging.getLogger(REGISTRATION).warning("'x::y' does not have a 'default' overload")
    warnings.warn("# The axis name: batch will not be used, since it shares the same shape "
                  "constraints with another axis: batch.", UserWarning, stacklevel=1)
    warnings.warn("something the user must see", UserWarning, stacklevel=1)


def test_other_warnings_and_logs_still_come_through(tmp_path, monkeypatch, torch_log):
    monkeypatch.setattr(torch.onnx, "export", _fake_export)
    with pytest.warns(UserWarning) as seen:
        onnx_mod.export_onnx(tiny(), tmp_path / "m.onnx", verify=False)
    assert [str(w.message) for w in seen] == ["something the user must see"]
    assert [r.getMessage() for r in torch_log] == ["'x::y' does not have a 'default' overload"]
    with warnings.catch_warnings():  # the caller's filters hold: -W error raises
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="must see"):
            onnx_mod.export_onnx(tiny(), tmp_path / "m.onnx", verify=False)


def test_single_file(tmp_path, monkeypatch):
    for name in ("onnxruntime", "onnxscript", "onnx"):
        require_module(name)
    model = attnprune.patch(tiny(), "attention_mass", keep_ratio=0.5)
    onnx_mod.export_onnx(model, tmp_path / "one.onnx", single_file=True)  # verified
    assert [p.name for p in tmp_path.iterdir()] == ["one.onnx"]
    with pytest.raises(ValueError, match="single_file must be True or False"):
        onnx_mod.export_onnx(model, tmp_path / "two.onnx", single_file="yes")
    monkeypatch.setattr(onnx_mod, "SINGLE_FILE_LIMIT", 1000)  # as if the model were > 2 GiB
    with pytest.raises(ValueError, match="over ONNX's 2 GiB for one file; export with "
                                         "single_file=False"):
        onnx_mod.export_onnx(model, tmp_path / "two.onnx", single_file=True)
    assert not (tmp_path / "two.onnx").exists()
