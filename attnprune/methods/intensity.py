"""Attention intensity modulation (``attention_intensity_modulation.txt`` §4, eq. 2–8).

Notation (the paper's): x_i ∈ ℝᵈ the layer's input at position i, p_i its position, H heads,
[lo, hi] the intensity range, σ the logistic sigmoid.

    pos_emb_i   = PositionalEmbedding(p_i)                                   (eq. 2)
    combined_i  = LayerNorm(x_i) + 0.1 · pos_emb_i                           (eq. 3)
    h1          = ReLU(Linear(combined_i, d/4))                              (eq. 4)
    h2          = ReLU(Linear(h1, d/4))                                      (eq. 5)
    h_res       = h2 + h1                                                    (eq. 6)
    I_i^(h)     = lo + (hi − lo) · σ(Linear^(h)(h_res))                      (eq. 7; paper: 0.2, 0.8)
    out         = softmax((I ⊙ QKᵀ)/√d_k) V,   I_ij = I_i                    (eq. 8)

The 0.1 weight of the positional embedding is the paper's (eq. 3). Presets for the paper's runs:

    ``basic``         run 1: 2-layer MLP on content only (no positions, no residual), [0.1, 1]
    ``conservative``  run 2: as run 1 with the range [0.5, 1]
    ``position``      run 3: positional embedding + residual, one factor for all heads, [0.2, 1]
    ``multihead``     run 4 (eq. 2–7 as written): as run 3 with a factor per head (default)

Because I_ij = I_i depends on the query only, (I ⊙ QKᵀ) = (I ⊙ Q)Kᵀ: the modulation is applied
by scaling the query rows and calling the fused ``F.scaled_dot_product_attention`` (the paper
switched modulation off whenever flash attention was available, and lost 31 % speed otherwise).
``path="eager"`` computes eq. 8 literally (scores, multiply, softmax) and is the reference the
tests compare against.

Predictor input: the hidden state the attention module receives (its ``hidden_states``
argument, i.e. x_i of eq. 3: the layer input for BERT/DistilBERT, ln_1(x) for GPT-2), captured
by the host with a forward pre-hook on the attention module; positions are the model's own
position ids when it passes them to its attention (Llama-family decoders), else the query
positions 0..T−1 (offset by the cache length in decoding). One predictor per layer (per depth
in ALBERT, whose layers share one attention module). With grouped-query attention the factors
are per query head (``n_heads`` = query heads): (I ⊙ Q)Kᵀ never needs the key heads.

``fixed=1.0`` replaces the predictor by a constant factor: 1 reproduces the stock model.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnprune.attention import (
    allowed_keys,
    fused_attention,
    masked_scores,
    score_bias,
    score_terms,
    softmax_rows,
)
from attnprune.methods.base import AttentionMethod
from attnprune.methods.registry import register

POS_WEIGHT = 0.1  # eq. 3 of the paper

PRESETS: dict[str, dict] = {
    "basic": {"lo": 0.1, "hi": 1.0, "positional": False, "residual": False, "per_head": False},
    "conservative": {"lo": 0.5, "hi": 1.0, "positional": False, "residual": False, "per_head": False},
    "position": {"lo": 0.2, "hi": 1.0, "positional": True, "residual": True, "per_head": False},
    "multihead": {"lo": 0.2, "hi": 1.0, "positional": True, "residual": True, "per_head": True},
}


class IntensityPredictor(nn.Module):
    """Eq. 2–7 for one layer: hidden states (B, T, d) → intensity (B, H', T), H' = H or 1."""

    def __init__(self, d_model: int, n_out: int, max_positions: int, lo: float, hi: float,
                 positional: bool, residual: bool) -> None:
        super().__init__()
        hidden = max(1, d_model // 4)  # d → d/4 → d/4 (eq. 4–5)
        self.norm = nn.LayerNorm(d_model)
        self.pos = nn.Embedding(max_positions, d_model) if positional else None
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, n_out)  # Linear^(h): one output per head (eq. 7)
        self.lo, self.hi, self.residual = lo, hi, residual

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """Intensity factors (B, H', T) in [lo, hi] for hidden states x (B, T, d) at
        ``positions`` (T,) or (B, T)."""
        z = self.norm(x)  # (B, T, d)
        if self.pos is not None:  # positions (T,) or (1|B, T)
            z = z + POS_WEIGHT * self.pos(positions if positions.dim() == 2 else positions[None])
        h1 = F.relu(self.fc1(z))
        h = F.relu(self.fc2(h1))
        if self.residual:
            h = h + h1
        gate = torch.sigmoid(self.head(h))  # (B, T, H')
        return (self.lo + (self.hi - self.lo) * gate).transpose(1, 2)  # (B, H', T)


@register("intensity", kind="attention", paper="attention_intensity_modulation.txt")
class IntensityModulation(AttentionMethod):
    """Attention intensity modulation: per-query (and per-head) factors scale QKᵀ."""

    needs_hidden = True
    neutral_options: ClassVar[dict] = {"fixed": 1.0}

    def __init__(
        self,
        preset: str = "multihead",
        lo: float | None = None,
        hi: float | None = None,
        positional: bool | None = None,
        residual: bool | None = None,
        per_head: bool | None = None,
        fixed: float | None = None,
        path: str = "sdpa",
        d_model: int = 64,
        n_heads: int = 1,
        n_layers: int = 1,
        max_positions: int = 512,
    ) -> None:
        super().__init__()
        if preset not in PRESETS:
            raise ValueError(f"preset: must be one of {sorted(PRESETS)}, got {preset!r}")
        if path not in ("sdpa", "eager"):
            raise ValueError(f"path: must be 'sdpa' or 'eager', got {path!r}")
        cfg = dict(PRESETS[preset])
        for name, value in {"lo": lo, "hi": hi, "positional": positional, "residual": residual,
                                "per_head": per_head}.items():
            if value is not None:
                cfg[name] = value
        if not 0.0 <= cfg["lo"] <= cfg["hi"]:
            raise ValueError(f"lo, hi: need 0 <= lo <= hi, got lo={cfg['lo']}, hi={cfg['hi']}")
        if fixed is not None and not fixed > 0:
            raise ValueError(f"fixed: must be > 0, got {fixed}")
        if max_positions < 1:
            raise ValueError(f"max_positions: must be >= 1, got {max_positions}")
        self.config = dict(preset=preset, **cfg, fixed=fixed, path=path)
        self.fixed, self.path = fixed, path
        self.max_positions = max_positions
        n_out = n_heads if cfg["per_head"] else 1
        self.predictors = nn.ModuleList()
        if fixed is None:
            self.predictors.extend(
                IntensityPredictor(d_model, n_out, max_positions, cfg["lo"], cfg["hi"],
                                   cfg["positional"], cfg["residual"])
                for _ in range(n_layers)
            )

    def intensity(self, hidden: Tensor | None, layer: int, tq: int, tk: int, batch: int,
                  device: torch.device, positions: Tensor | None = None) -> Tensor:
        """Factors (B, H'|1, Tq) for the queries of ``layer``; H' broadcasts over heads.

        ``positions``: the queries' position ids (1|B, ≥ Tq; the last Tq are the queries') when
        the model passes them to its attention (Llama-family decoders do) or to its forward
        (``generate`` does, for left-padded rows): they stay right when a sliding-window cache
        keeps fewer keys than positions seen. Otherwise the queries are the last Tq of Tk keys.
        """
        if self.fixed is not None:
            return torch.full((1, 1, tq), float(self.fixed), device=device)
        if hidden is None:
            raise RuntimeError("intensity: the host did not capture the layer's hidden state")
        if positions is not None and positions.dim() == 1:
            positions = positions[None]
        if positions is not None and positions.dim() == 2 and positions.shape[-1] >= tq:
            positions = positions[:, -tq:]
        else:
            positions = torch.arange(tk - tq, tk, device=device)[None]
        positions = positions.to(device=device, dtype=torch.long).clamp_min(0)
        if int(positions.max()) >= self.max_positions:
            raise ValueError(
                f"max_positions: sequence position {int(positions.max())} exceeds the "
                f"predictor's {self.max_positions} positions"
            )
        return self.predictors[layer](hidden[:, -tq:], positions)

    def attend(
        self,
        module: nn.Module,
        query: Tensor,  # (B, H, Tq, d)
        key: Tensor,  # (B, H, Tk, d)
        value: Tensor,  # (B, H, Tk, d)
        mask: Tensor | None,
        *,
        dropout: float,
        scaling: float,
        layer: int,
        hidden: Tensor | None = None,
        need_weights: bool = False,
        softcap: float | None = None,
        bias: Tensor | None = None,
        positions: Tensor | None = None,
        **_,
    ) -> tuple[Tensor, Tensor | None]:
        """Modulated attention; out (B, Tq, H, d). ``need_weights`` forces the eager path.

        I scales the content scores QKᵀ only: a family's own terms (Gemma 2's softcap, applied
        to the modulated scores; MPNet's and DeBERTa's position terms, added unscaled) keep
        their meaning, and I = 1 is the stock model in every family."""
        b, _, tq, _ = query.shape
        tk = key.shape[-2]
        inten = self.intensity(hidden, layer, tq, tk, b, query.device,
                               positions)[..., None]  # (B, H', Tq, 1)
        is_causal = bool(getattr(module, "is_causal", False))
        if self.path == "eager" or need_weights:
            allowed = allowed_keys(mask, is_causal, tq, tk, query.device)
            # eq. 8 literally: I ⊙ (QKᵀ) then /√d_k (scaling), then the family's terms, the
            # soft token masks of a stacked token method, and the mask (disallowed entries −∞)
            scores = masked_scores(query, key, 1.0, None) * inten.to(query.dtype) * scaling
            scores = score_terms(scores, allowed, softcap=softcap, bias=score_bias(mask, tk, bias))
            probs = softmax_rows(scores).to(value.dtype)
            probs = F.dropout(probs, p=dropout, training=module.training)
            return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs
        # (I ⊙ Q)Kᵀ = I ⊙ QKᵀ since I_ij = I_i: stays inside the fused kernel
        q = query * inten.to(query.dtype)
        out = fused_attention(q, key, value, mask, is_causal=is_causal, scaling=scaling,
                              dropout=dropout, training=module.training, softcap=softcap,
                              bias=bias)
        return out, None
