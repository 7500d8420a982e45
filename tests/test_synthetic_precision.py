"""Training-step precision of the synthetic track: validated, and bf16 trains to finite losses."""

import math

import pytest
import torch

from attnprune.research.synthetic.config import SyntheticConfig
from attnprune.research.synthetic.host import TinyConfig, TinyEncoder
from attnprune.research.synthetic.train import TrainConfig, train_model
from attnprune.runs.config import ConfigError, load_config


def test_precision_is_validated():
    with pytest.raises(ConfigError, match="precision"):
        load_config(SyntheticConfig, None, ["--precision", "half"])
    assert TrainConfig(precision="fp32").use_bf16() is False
    assert TrainConfig(precision="bf16").use_bf16() is True


def test_bf16_training_steps_learn():
    torch.manual_seed(0)
    model = TinyEncoder(TinyConfig(vocab=50, d_model=16, method="entropy"))
    tokens = torch.randint(0, 50, (128, 12))
    labels = (tokens[:, 0] < 25).long()  # the first token tells the class
    hist = train_model(model, tokens, labels, tokens, labels,
                       TrainConfig(epochs=4, batch_size=32, lr=1e-2, precision="bf16"), seed=0)
    assert all(math.isfinite(h["train_loss"]) for h in hist)
    assert hist[-1]["train_loss"] < hist[0]["train_loss"]
    assert next(model.parameters()).dtype == torch.float32  # parameters stay fp32


@pytest.mark.parametrize("method", ["attention_mass", "entropy", "entropy_gumbel"])
def test_gate_decides_in_float32_under_bf16_autocast(method):
    """The matmuls go bf16 but A⁽¹⁾ and the gate's scores stay float32: in bf16 the scores'
    8 mantissa bits would turn close tokens into ties for top-k."""
    torch.manual_seed(0)
    model = TinyEncoder(TinyConfig(vocab=50, d_model=16, method=method)).train()
    tokens = torch.randint(0, 50, (8, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens, labels=torch.zeros(8, dtype=torch.long))
    assert out.attn1.dtype == torch.float32
    assert out.scores.dtype == torch.float32
    assert out.logits.dtype == torch.bfloat16  # the classifier's matmul did run in bf16


def test_bf16_and_fp32_training_agree_on_an_easy_task():
    accs = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = TinyEncoder(TinyConfig(vocab=50, d_model=16, method="entropy"))
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(2, 50, (256, 12), generator=g)
        labels = torch.randint(0, 2, (256,), generator=g)
        tokens[:, :3] = labels[:, None]  # token 0 or 1, three times, tells the class
        tokens = tokens[:, torch.randperm(12, generator=g)]
        hist = train_model(model, tokens, labels, tokens, labels,
                           TrainConfig(epochs=8, batch_size=32, lr=1e-2, precision=precision),
                           seed=0)
        accs[precision] = hist[-1]["val_accuracy"]
    assert accs["fp32"] > 0.9 and abs(accs["fp32"] - accs["bf16"]) < 0.05, accs


def test_default_precision_is_auto_and_fp32_without_native_bf16(monkeypatch):
    """A new user's CPU may lack native bf16 matmuls (AVX2 only): there emulated bf16 is slower
    than fp32, so neither the config file nor the dataclass may default to bf16."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    assert SyntheticConfig().precision == "auto"
    assert load_config(SyntheticConfig, repo / "configs" / "synthetic.yaml").precision == "auto"
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert TrainConfig(precision=SyntheticConfig().precision).use_bf16() is False
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert TrainConfig(precision=SyntheticConfig().precision).use_bf16() is True
