"""Training-step precision of the synthetic track: validated, and bf16 trains to finite losses."""

import math

import pytest
import torch

from attnprune.config import ConfigError, load_config
from attnprune.hosts.tiny import TinyConfig, TinyEncoder
from attnprune.synthetic.run import SyntheticConfig
from attnprune.synthetic.train import TrainConfig, train_model


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
