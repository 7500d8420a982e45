"""Dynamic Token Reduction (``token_pruning_bert_to_gpt2.txt``, "DTR"; TR-BERT, Ye et al. 2021).

At each chosen layer l a policy reads the state of every alive token and gives the
probability of keeping it:

    π(a = keep | h) = σ(W2 · GELU(W1 · LN(h)))                  (policy network)
    a_t ~ Bernoulli(π) in training;  keep iff π ≥ 0.5 at inference
    L_total = L_LM + α · L_policy,  α = 0.1 (paper)              (backbone frozen in this stage)

Notation: t, s positions, ℓ_s the next-token loss at position s, n_l the number of blocks,
c_t = (blocks that process token t) / n_l its compute share (a token dropped before block l
costs l / n_l), ρ* the target kept share, γ the discount, K samples per sequence.

The paper's reward is one number per sequence, R = −L_LM − λ · kept, with a batch-mean
baseline R̄. On ``shakespeare_char`` / ``cpu-small`` that learned only the overall keep rate:
R − R̄ is dominated by how hard each sequence is, and one reward is shared by ~250 decisions,
so the only signal that survives the noise is "keep more" or "keep fewer" — every token moved
together and λ = 2 kept everything, λ = 3 kept 2–5 %. Three changes give each decision its own
credit (all unbiased or with a stated bias; tests check them on a toy problem):

1. **Per-position return** (the causal structure): the reward is a sum over positions,
   r_s = −ℓ_s − λ · c_s (the paper's two terms, per token), and dropping token t changes only
   r_s for s ≥ t (earlier positions cannot see it, nor decide after it), so the actions of
   token t are credited

       G_t = Σ_{s ≥ t} γ^{s−t} r_s

   With γ = 1 this is the "reward-to-go" of policy gradients: unbiased for ∇ E[Σ_s r_s], and
   it removes the noise of every earlier position. γ < 1 (default 0.9, a horizon of ~10
   characters) also damps far positions, where the effect of one dropped character is small
   but the noise of the other ~2·(T − t) decisions is large: a bias toward local effects,
   traded for variance (with γ = 1, Var G_t grows with T − t; with γ = 0.9 it is bounded by
   Σ γ^{2k} ≈ 5 positions' worth).
2. **Leave-one-out baseline over K samples of the same sequence** (``samples``, default 4):
   the training loop feeds every sequence K times in a row (rows k·K … k·K + K − 1), and the
   baseline of sample k at position t is the mean G_t of the other K − 1 samples. It is
   independent of sample k's actions, so the estimator stays unbiased, and it removes what
   the batch mean could not: how hard this text is at this position. A learned value
   baseline V(h_t) would need its own fitting and lags behind the policy; the LOO baseline is
   exact for every K ≥ 2 at the price of K forwards (cheap in stage 1: the backbone is
   frozen, only the policy gets gradients). If the batch is not made of groups of K, the
   whole batch is one group (still unbiased: the others' returns do not depend on one's
   own actions).
3. **A budget that targets a kept share** (``keep_target`` ρ*): a fixed λ gave all or nothing,
   because the kept share is a steep function of λ. With ρ* set, λ is a Lagrange multiplier
   of the constraint mean_t c_t = ρ*, updated after every training batch (an augmented
   Lagrangian, i.e. a PI controller on the measured kept share c̄ of the sampled actions):

       λ_I ← λ_I + η · (c̄ − ρ*),   λ = λ_I + κ · (c̄ − ρ*)       (η ``budget_lr``, κ ``budget_gain``)

   (λ of a batch uses the previous batch's c̄, so it never depends on the actions it rewards.)

   The integral term removes the steady-state error; the proportional term damps the loop
   (the policy's keep rate itself integrates λ − λ*, and two integrators in a loop
   oscillate). λ_I is a buffer (``budget_lambda``), saved with the weights, so a resumed run
   continues where it stopped. c̄ is over all blocks, so ρ* is the kept ratio that ``lm``
   reports; it must be ≥ (first decision layer) / n_l, the share of the never-pruned blocks.
   Without ρ*, λ = ``sparsity_weight`` is fixed (the paper's linear cost, 1e-4).
   Measured (``shakespeare_char`` / ``cpu-small``, README): with η = 0.05 the kept share
   reached ρ* = 0.6 within ~100 policy steps from the start at 0.9, but targets near the start
   (ρ* = 0.8: error 0.16, λ_I += 0.008 per step) need more steps or a larger η. At
   inference a token is kept iff π ≥ 0.5, so the measured share equals the sampled one only
   once π has saturated.

    L_policy = −(1/n) Σ_{k, t} (G_t^k − mean_{j≠k} G_t^j) · Σ_l log π(a_t^{l,k} | h_t^{l,k})

(n: the real positions of the batch.)

A token dropped at one layer stays dropped (the host never scores it again). π depends on h_t
only, hence on tokens ≤ t: the decision is causal and a cached decode step makes the same one
as a full recompute.

Choices the paper leaves open (ours): hidden width of the policy d/2; LN (no affine) on its
input so its scale does not depend on the depth; the last bias starts at logit(0.9) so the
policy keeps most tokens at first (REINFORCE then learns what to drop).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnprune.methods.base import Selection, TokenMethod
from attnprune.methods.ltp_causal import parse_layers
from attnprune.methods.registry import register


def default_dtr_layers(n_layers: int) -> list[int]:
    """Layers 4 and 8 of the paper's 12, scaled to the depth: round(L/3), round(2L/3) (≥ 1)."""
    return sorted({max(1, min(n_layers - 1, round(n_layers * k / 12))) for k in (4, 8)})


def discounted_returns(reward: Tensor, gamma: float) -> Tensor:
    """G_t = Σ_{s ≥ t} γ^{s−t} r_s for ``reward`` (N, T)."""
    T = reward.shape[-1]
    pos = torch.arange(T, device=reward.device, dtype=reward.dtype)
    lag = pos[None, :] - pos[:, None]  # (t, s): s − t
    w = torch.where(lag >= 0, gamma ** lag.clamp_min(0), torch.zeros_like(lag))  # upper triangle
    return reward @ w.T  # (N, T)


def leave_one_out(r: Tensor, group: int) -> Tensor:
    """r − (mean of the other rows of its group), groups of ``group`` consecutive rows of
    ``r`` (N, T); N not divisible by ``group`` (or group < 2) → the whole batch is one group."""
    N = r.shape[0]
    if group < 2 or N % group:
        group = N
    if group < 2:
        return torch.zeros_like(r)  # one sample: nothing to compare with, no signal
    g = r.reshape(N // group, group, *r.shape[1:])
    others = (g.sum(1, keepdim=True) - g) / (group - 1)
    return (g - others).reshape(r.shape)


def token_compute_share(actions: list[dict], shape: tuple[int, int], n_layers: int,
                        device) -> Tensor:
    """c_t (N, T): blocks that process token t over n_l, from the actions of one forward
    (each dict: ``keep`` and ``alive`` (N, K) in compact order, ``layer``, ``index`` (N, K))."""
    blocks = torch.full(shape, float(n_layers), device=device)
    for a in actions:
        dropped = (a["alive"] & ~a["keep"]).to(blocks.dtype)  # (N, K): dropped before ``layer``
        # scatter_add, not scatter: padding slots may share a position with a real token
        hit = torch.zeros_like(blocks).scatter_add(1, a["index"], dropped) > 0
        blocks = torch.where(hit, torch.full_like(blocks, float(a["layer"])), blocks)
    return blocks / n_layers


def per_token_log_prob(actions: list[dict], shape: tuple[int, int], device) -> Tensor:
    """Σ_l log π(a_t^l) (N, T) at original positions (0 where token t took no decision)."""
    out = torch.zeros(shape, device=device)
    for a in actions:
        out = out.scatter_add(1, a["index"], a["log_prob"] * a["alive"].to(out.dtype))
    return out


class Policy(nn.Module):
    """π(keep | h) = σ(W2 · GELU(W1 · LN(h))), one per decision layer."""

    def __init__(self, d_model: int, hidden: int, init_keep: float) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden)
        self.act = nn.GELU()
        self.w2 = nn.Linear(hidden, 1)
        nn.init.zeros_(self.w2.weight)  # start from a constant policy π = init_keep
        nn.init.constant_(self.w2.bias, math.log(init_keep / (1 - init_keep)))

    def forward(self, h: Tensor) -> Tensor:
        h = F.layer_norm(h, h.shape[-1:])
        return torch.sigmoid(self.w2(self.act(self.w1(h)))).squeeze(-1)  # (B, K)


@register("dtr", kind="token", paper="token_pruning_bert_to_gpt2.txt (DTR: policy, reward, REINFORCE)")
class DTR(TokenMethod):
    """REINFORCE token-keep policy at chosen layers (Bernoulli in training, π ≥ 0.5 at eval),
    per-position returns, a leave-one-out baseline over K samples and a kept-share budget."""

    variable_budget = True  # the kept count is decided per token (policy / thresholds), not ⌊ρ·n⌋

    causal = True

    def __init__(self, d_model: int, n_layers: int, layers=None, hidden: int | None = None,
                 sparsity_weight: float = 1e-4, alpha: float = 0.1, init_keep: float = 0.9,
                 keep_target: float | None = None, samples: int = 4, discount: float = 0.9,
                 budget_lr: float = 0.05, budget_gain: float = 2.0) -> None:
        super().__init__()
        self.layers = parse_layers(layers, n_layers, default_dtr_layers(n_layers))
        self.n_layers = int(n_layers)
        if sparsity_weight < 0:
            raise ValueError(f"sparsity_weight must be ≥ 0, got {sparsity_weight}")
        if alpha < 0:
            raise ValueError(f"alpha must be ≥ 0, got {alpha}")
        if not 0.0 < init_keep < 1.0:
            raise ValueError(f"init_keep must be in (0, 1), got {init_keep}")
        floor = self.layers[0] / n_layers  # blocks before the first decision always run
        if keep_target is not None and not floor <= keep_target <= 1.0:
            raise ValueError(f"keep_target must be in [{floor:g}, 1] (blocks 0..{self.layers[0] - 1} "
                             f"are never pruned), got {keep_target}")
        if int(samples) != samples or samples < 1:
            raise ValueError(f"samples must be an integer ≥ 1, got {samples}")
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {discount}")
        if budget_lr < 0 or budget_gain < 0:
            raise ValueError(f"budget_lr and budget_gain must be ≥ 0, got {budget_lr}, {budget_gain}")
        self.sparsity_weight = float(sparsity_weight)  # λ (paper 1e-4); λ_I's start with a target
        self.alpha = float(alpha)  # α = 0.1 (paper)
        self.keep_target = None if keep_target is None else float(keep_target)
        self.samples = int(samples)  # K: rows per sequence the training loop feeds
        self.discount = float(discount)
        self.budget_lr, self.budget_gain = float(budget_lr), float(budget_gain)
        self.register_buffer("budget_lambda", torch.tensor(float(sparsity_weight)))  # λ_I
        self.last_train_kept: float | None = None  # c̄ of the last training batch (for logs)
        width = hidden or max(8, d_model // 2)
        self.policies = nn.ModuleDict({str(l): Policy(d_model, width, init_keep) for l in self.layers})

    def forward(self, hidden, mask, attn=None, keep_ratio=None, layer=0, labels=None, protect=None):
        """Selection for the tokens entering block ``layer``; per-token actions and their
        log-probabilities (compact order, like ``hidden``) in ``info`` in training."""
        # Outside a host, a layer without a policy uses the first decision layer's policy.
        key = str(layer) if str(layer) in self.policies else str(self.layers[0])
        p = self.policies[key](hidden)  # (B, K)
        if keep_ratio is not None and keep_ratio >= 1.0:  # ρ = 1: pruning off
            return Selection(mask.clone(), scores=p)
        prot = torch.zeros_like(mask) if protect is None else protect & mask
        if not self.training:
            return Selection(((p >= 0.5) & mask) | prot, scores=p)
        a = (torch.bernoulli(p.detach()).bool() & mask) | prot
        eps = 1e-6  # keeps log finite when π saturates
        logp = torch.where(a, (p + eps).log(), (1 - p + eps).log()) * mask.to(p.dtype)
        info = {"log_prob": logp, "keep": a, "alive": mask & ~prot, "layer": int(layer)}
        return Selection(a, scores=p, info=info)

    def current_lambda(self) -> float:
        """λ of the next batch's rewards: fixed, or λ_I + κ · (c̄ of the last batch − ρ*).

        The last batch's c̄, not this one's: λ then does not depend on this batch's actions,
        so the estimator stays unbiased for the λ it uses."""
        if self.keep_target is None:
            return self.sparsity_weight
        err = 0.0 if self.last_train_kept is None else self.last_train_kept - self.keep_target
        return float(self.budget_lambda) + self.budget_gain * err

    def reinforce_loss(self, actions: list[dict], token_loss: Tensor, valid: Tensor | None = None) -> Tensor:
        """α · L_policy from the last forward's actions (each with ``index`` (N, K), the
        original positions, added by the host) and the per-position LM losses ``token_loss``
        (N, T) (``valid`` (N, T) marks real tokens; a position without a loss holds 0).

        In training with ``keep_target`` it also takes one step of λ_I (see the module
        docstring): the only state it changes, a buffer the caller can read.
        """
        N, T = token_loss.shape
        dev = token_loss.device
        valid = torch.ones(N, T, dtype=torch.bool, device=dev) if valid is None else valid.bool()
        logp = per_token_log_prob(actions, (N, T), dev)
        with torch.no_grad():
            cost = token_compute_share(actions, (N, T), self.n_layers, dev)
            kept = float(cost[valid].mean()) if bool(valid.any()) else 1.0
            lam = self.current_lambda()
            r = -(token_loss.float() + lam * cost) * valid  # r_s (N, T)
            ret = discounted_returns(r, self.discount)  # G_t
            adv = leave_one_out(ret, self.samples) * valid  # (N, T)
            self.last_train_kept = kept
            if self.training and self.keep_target is not None:
                self.budget_lambda += self.budget_lr * (kept - self.keep_target)
        return -self.alpha * (adv * logp).sum() / valid.sum().clamp_min(1)

    @torch.no_grad()
    def match_rates_(self, kept_per_layer: list[float]) -> None:
        """Make every policy constant: at decision layer l it keeps the share
        kept_l / kept_(previous decision layer) of the tokens reaching it, so that, sampled
        (training mode), it drops random tokens at the per-layer kept ratios
        ``kept_per_layer`` of a learned policy: the control that tells per-token decisions
        from a mere keep rate."""
        prev = 1.0
        for l in self.layers:
            rate = min(max(kept_per_layer[l] / max(prev, 1e-9), 1e-4), 1 - 1e-4)
            prev = kept_per_layer[l]
            pol = self.policies[str(l)]
            pol.w2.weight.zero_()
            pol.w2.bias.fill_(math.log(rate / (1 - rate)))

    def train_stats(self) -> dict:
        """λ and the last training batch's sampled kept share, for training logs."""
        return {"budget_lambda": float(self.budget_lambda), "train_kept": self.last_train_kept}
