"""DTR's estimator: unbiased on a toy problem, per-token credit, a budget that reaches its
target, and the host's per-token bookkeeping on a tiny GPT-2."""

from __future__ import annotations

import itertools

import pytest
import torch

import attnprune
from attnprune.methods.dtr import DTR, discounted_returns, leave_one_out, token_compute_share

# Toy problem: T tokens, one decision layer (block 1 of 2), independent keep probabilities
# π_t = σ(θ_t). Dropping token t adds drop_cost[t] to ℓ_t and spill[t] to ℓ_{t+1} (a later
# position that attended to it). c_t = 1 if kept, 1/2 if dropped.


def toy_losses(a: torch.Tensor, drop_cost: torch.Tensor, spill: torch.Tensor) -> torch.Tensor:
    """ℓ (N, T) for keep decisions ``a`` (N, T) bool."""
    d = (~a).float()
    loss = 1.0 + d * drop_cost
    loss[:, 1:] += d[:, :-1] * spill[:-1]
    return loss


def toy_actions(theta: torch.Tensor, a: torch.Tensor) -> list[dict]:
    N, T = a.shape
    p = torch.sigmoid(theta).expand(N, T)
    logp = torch.where(a, p.log(), (1 - p).log())
    return [{"log_prob": logp, "keep": a, "alive": torch.ones_like(a), "layer": 1,
             "index": torch.arange(T).expand(N, T)}]


def exact_objective(theta: torch.Tensor, drop_cost, spill, lam: float) -> torch.Tensor:
    """J(θ) = E[Σ_s r_s], r_s = −ℓ_s − λ c_s, by enumerating every action vector."""
    T = theta.shape[0]
    p = torch.sigmoid(theta)
    J = theta.new_zeros(())
    for bits in itertools.product([False, True], repeat=T):
        a = torch.tensor(bits)[None]
        prob = torch.where(a[0], p, 1 - p).prod()
        cost = torch.where(a, 1.0, 0.5)
        J = J + prob * (-(toy_losses(a, drop_cost, spill) + lam * cost).sum())
    return J


def test_gradient_estimator_is_unbiased_on_a_toy_problem():
    """γ = 1: E[∇ L_policy] = −α ∇J / T, checked against the exact gradient (enumeration of
    2^T action vectors) within 4 standard errors over independent groups of samples."""
    T, lam, K, groups = 4, 0.7, 4, 6000
    drop_cost = torch.tensor([0.1, 0.8, 0.3, 1.2])
    spill = torch.tensor([0.5, 0.0, 0.4, 0.0])
    theta = torch.tensor([0.3, -0.4, 1.0, 0.0], requires_grad=True)
    exact = torch.autograd.grad(exact_objective(theta, drop_cost, spill, lam), theta)[0]

    g = torch.Generator().manual_seed(0)
    p = torch.sigmoid(theta.detach())
    a = torch.rand(groups * K, T, generator=g) < p  # K samples of each group's "sequence"
    dtr = DTR(d_model=8, n_layers=2, layers=[1], sparsity_weight=lam, alpha=1.0, samples=K,
              discount=1.0).train()
    loss = dtr.reinforce_loss(toy_actions(theta, a), toy_losses(a, drop_cost, spill))
    est = torch.autograd.grad(loss, theta)[0] * -T  # an estimate of ∇J
    # Standard error from the groups (independent; samples inside one share the LOO baseline):
    # the per-row gradient is A_t · (a_t − π_t) for a Bernoulli with logit θ_t.
    with torch.no_grad():
        cost = torch.where(a, 1.0, 0.5)
        ret = discounted_returns(-(toy_losses(a, drop_cost, spill) + lam * cost), 1.0)
        per_row = leave_one_out(ret, K) * (a.float() - p)
        per_group = per_row.view(groups, K, T).sum(1)
        se = per_group.std(0) / groups**0.5 / K
    assert torch.allclose(est, per_group.mean(0) / K, atol=1e-4)  # same estimator, by hand
    assert ((est - exact).abs() < 4 * se).all(), (est, exact, se)
    assert (exact.abs() > 6 * se).any()  # the check has power: some gradient is far from 0


def test_per_position_advantage_credits_the_dropped_token():
    """Two samples of one sequence differ only at token 2: the advantage differs only at
    positions ≤ 2 (γ = 1), and is zero where the returns agree. A per-sequence reward would
    give every position the same advantage."""
    a = torch.ones(2, 6, dtype=torch.bool)
    a[1, 2] = False
    drop_cost = torch.full((6,), 1.0)
    loss = toy_losses(a, drop_cost, torch.zeros(6))
    ret = discounted_returns(-loss, 1.0)
    adv = leave_one_out(ret, 2)
    assert torch.equal(adv[:, 3:], torch.zeros(2, 3))
    assert (adv[0, :3] > 0).all() and (adv[1, :3] < 0).all()
    # With γ < 1 the same drop is credited less to positions farther before it... and only
    # token 2's own decision sees the full difference.
    adv_g = leave_one_out(discounted_returns(-loss, 0.5), 2)
    assert adv_g[0, 2] > adv_g[0, 1] > adv_g[0, 0] > 0


def _train_toy(keep_target: float, steps: int = 400, seed: int = 0):
    """Learn independent per-token logits on the toy with Adam; returns (π, kept, λ_I)."""
    T = 8
    drop_cost = torch.linspace(0.0, 1.4, T)  # token 0 is free to drop, token 7 costly
    theta = torch.full((T,), 2.0, requires_grad=True)  # start keeping everything (π ≈ 0.88)
    opt = torch.optim.Adam([theta], lr=0.05)
    dtr = DTR(d_model=8, n_layers=2, layers=[1], sparsity_weight=0.0, alpha=1.0, samples=4,
              keep_target=keep_target).train()
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        with torch.no_grad():
            a = torch.rand(64, T, generator=g) < torch.sigmoid(theta)
        loss = dtr.reinforce_loss(toy_actions(theta, a), toy_losses(a, drop_cost, torch.zeros(T)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    p = torch.sigmoid(theta.detach())
    kept = float((0.5 + 0.5 * (p >= 0.5).float()).mean())  # deterministic decisions, as at eval
    return p, kept, float(dtr.budget_lambda)


@pytest.mark.parametrize("target", [0.625, 0.8125])
def test_budget_moves_the_kept_share_to_the_target_by_dropping_the_cheap_tokens(target):
    """c ∈ {1/2, 1}: target 0.625 means dropping 6 of 8 tokens, 0.8125 dropping 3. The policy
    drops the cheapest ones (per-token decisions, not all or nothing)."""
    p, kept, lam = _train_toy(target)
    n_drop = round((1 - target) * 2 * 8)
    assert abs(kept - target) <= 1 / 16 + 1e-6, (kept, p)  # within one token of the target
    order = torch.argsort(p)  # the least kept first
    assert set(order[:n_drop - 1].tolist()) <= set(range(n_drop + 1)), p  # cheap ones dropped
    assert (p[-2:] > 0.5).all() and (p[:2] < 0.5).all()
    assert lam > 0


def test_budget_lambda_rises_when_above_target_and_is_saved():
    dtr = DTR(d_model=8, n_layers=4, layers=[1, 3], keep_target=0.5, budget_lr=0.1).train()
    a = torch.ones(4, 5, dtype=torch.bool)  # everything kept: c̄ = 1 > 0.5
    acts = [{"log_prob": torch.zeros(4, 5, requires_grad=True), "keep": a, "alive": a, "layer": 1,
             "index": torch.arange(5).expand(4, 5)}]
    dtr.reinforce_loss(acts, torch.ones(4, 5))
    assert float(dtr.budget_lambda) == pytest.approx(1e-4 + 0.1 * 0.5)
    assert "budget_lambda" in dtr.state_dict()
    dtr.eval()  # no update outside training
    dtr.reinforce_loss(acts, torch.ones(4, 5))
    assert float(dtr.budget_lambda) == pytest.approx(1e-4 + 0.1 * 0.5)


@pytest.mark.parametrize("bad", [{"keep_target": 0.2}, {"keep_target": 1.5}, {"samples": 0},
                                 {"discount": 1.5}, {"budget_lr": -1.0}])
def test_bad_options_name_the_field(bad):
    key = next(iter(bad))
    with pytest.raises(ValueError, match=key):
        DTR(d_model=8, n_layers=4, layers=[1, 3], **bad)


def test_compute_share_from_the_host_matches_its_kept_ratio():
    """On a tiny GPT-2 in training: c_t built from the host's actions (compact order mapped
    back with ``index``) averages to the kept ratio the host counted per block."""
    from test_hf_causal import force_pruning, tiny  # tests/ is on sys.path

    model = tiny()
    attnprune.patch(model, "dtr", layers=[1, 2])
    force_pruning(model)
    model.train()
    torch.manual_seed(0)
    x = torch.randint(0, 40, (6, 20))
    model(x)
    st = attnprune.patch_state(model)
    c = token_compute_share(st.actions, (6, 20), 4, x.device)
    kept = st.stats["kept_per_layer"]
    assert 0 < kept[2] < kept[1] < 1  # both decision layers pruned some tokens
    assert float(c.mean()) == pytest.approx(sum(kept) / len(kept), abs=1e-6)


def test_matched_random_policy_keeps_the_same_share_per_layer():
    """``match_rates_``: sampled, the constant policies drop random tokens at the learned
    per-layer kept ratios (the control of ``lm``'s random_policy_control)."""
    from test_hf_causal import tiny

    model = tiny()
    attnprune.patch(model, "dtr", layers=[1, 3])
    m = model.transformer.attnprune_method
    m.match_rates_([1.0, 0.6, 0.6, 0.3])
    model.eval()
    m.train()
    torch.manual_seed(0)
    model(torch.randint(0, 40, (32, 40)))
    kept = attnprune.patch_state(model).stats["kept_per_layer"]
    assert kept[0] == 1.0 and abs(kept[1] - 0.6) < 0.05 and abs(kept[3] - 0.3) < 0.05
