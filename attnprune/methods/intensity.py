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
by the host with a forward pre-hook on the attention module; positions are the query positions
0..T−1 (offset by the cache length in decoding). One predictor per layer.

``fixed=1.0`` replaces the predictor by a constant factor: 1 reproduces the stock model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..registry import register
from .crisp import allowed_keys, masked_scores, score_bias, softmax_rows

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
        """Intensity factors (B, H', T) in [lo, hi] for hidden states x (B, T, d)."""
        z = self.norm(x)  # (B, T, d)
        if self.pos is not None:
            z = z + POS_WEIGHT * self.pos(positions)[None]
        h1 = F.relu(self.fc1(z))
        h = F.relu(self.fc2(h1))
        if self.residual:
            h = h + h1
        gate = torch.sigmoid(self.head(h))  # (B, T, H')
        return (self.lo + (self.hi - self.lo) * gate).transpose(1, 2)  # (B, H', T)


@register("intensity", kind="attention", paper="attention_intensity_modulation.txt")
class IntensityModulation(nn.Module):
    """Attention intensity modulation: per-query (and per-head) factors scale QKᵀ."""

    needs_hidden = True

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
                  device: torch.device) -> Tensor:
        """Factors (B, H'|1, Tq) for the queries of ``layer``; H' broadcasts over heads."""
        if self.fixed is not None:
            return torch.full((1, 1, tq), float(self.fixed), device=device)
        if hidden is None:
            raise RuntimeError("intensity: the host did not capture the layer's hidden state")
        positions = torch.arange(tk - tq, tk, device=device)
        if int(positions[-1]) >= self.max_positions:
            raise ValueError(
                f"max_positions: sequence position {int(positions[-1])} exceeds the predictor's "
                f"{self.max_positions} positions"
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
        **_,
    ) -> tuple[Tensor, Tensor | None]:
        """Modulated attention; out (B, Tq, H, d). ``need_weights`` forces the eager path."""
        b, _, tq, _ = query.shape
        tk = key.shape[-2]
        inten = self.intensity(hidden, layer, tq, tk, b, query.device)[..., None]  # (B,H',Tq,1)
        is_causal = bool(getattr(module, "is_causal", False))
        if self.path == "eager" or need_weights:
            allowed = allowed_keys(mask, is_causal, tq, tk, query.device)
            # eq. 8 literally: I ⊙ (QKᵀ) then /√d_k (scaling), disallowed entries −∞
            scores = masked_scores(query, key, 1.0, allowed) * inten.to(query.dtype) * scaling
            bias = score_bias(mask, tk)  # soft token masks of a stacked token method
            if bias is not None:
                scores = scores + bias.to(scores.dtype)
            probs = softmax_rows(scores).to(value.dtype)
            probs = F.dropout(probs, p=dropout, training=module.training)
            return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs
        # (I ⊙ Q)Kᵀ = I ⊙ QKᵀ since I_ij = I_i: stays inside the fused kernel
        q = query * inten.to(query.dtype)
        causal = mask is None and is_causal and tq > 1
        out = F.scaled_dot_product_attention(
            q, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0,
            scale=scaling, is_causal=causal)
        return out.transpose(1, 2).contiguous(), None
