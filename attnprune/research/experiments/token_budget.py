"""The cost paper's Tables 1–2 on long inputs: accuracy, FLOPs and time at an absolute token
budget k, and the attention's Gini coefficient and entropy against k (issue 13).

    python -m attnprune.research.experiments.token_budget --config configs/token_budget_cpu.yaml --out results/budget --exact-out

``compute_cost_incentive_ocr_zh.txt`` Table 1 keeps the top k of BERT-base's 512 tokens
(k ∈ {256, 128, 64, 32}) and reports accuracy and GFLOPs; Table 2 the Gini coefficient and
Shannon entropy of the attention at each k. Here, per seed: MiniLM-L6 is fine-tuned on
``data`` (default ``shakespeare_genre``: every passage has ≥ 259 tokens, so truncated to
``max_length`` every row has exactly ``max_length`` real tokens and a budget k is the keep
ratio ρ = k / ``max_length`` exactly; any shorter row stops the run with its index); then
every budget k is scored on a copy with ``attention_mass`` token pruning after layer
``after_layer`` (the mean scorer), without retraining:

* Table 1 (``table1.md``): k, ρ, accuracy (mean, t-interval over seeds), Δ against the full
  model (per seed on the same test rows; McNemar per seed, Holm over the table), GFLOPs per
  example counted with ``count_flops`` and relative to the full model on the same batches,
  wall time relative to the full model (interleaved, one process).
* Table 2 (``table2.md``): the Gini coefficient and entropy (bits) of the attention rows of the
  pruned layers (those after the cut, which attend over k keys) and of all layers, with
  log₂ k beside the entropy (its ceiling); measured with eager attention and forward hooks on
  the attention modules (:func:`attnprune.research.analysis.row_gini`, ``row_entropy_bits``).

A rerun with the same ``--out`` skips finished seeds.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass

import numpy as np
import torch

from attnprune import api
from attnprune.compat import attn_implementation
from attnprune.measure import env_info
from attnprune.runs import stats
from attnprune.runs.command import run_command
from attnprune.runs.config import check_training_fields, to_dict
from attnprune.runs.report import fmt_mean_ci
from attnprune.runs.results import ResultsDir

FULL = "full"


@dataclass(frozen=True)
class BudgetConfig:
    """Settings of the token-budget experiment (every field is a ``--key value`` option)."""

    model: str = "minilm"
    data: str = "shakespeare_genre"
    max_length: int = 256
    budgets: tuple[int, ...] = (128, 64, 32, 16)
    after_layer: int = 1
    epochs: int = 2
    lr: float = 5e-5
    batch_size: int = 16
    eval_batch_size: int = 32
    max_train: int | None = None
    max_eval: int | None = None
    seeds: tuple[int, ...] = (0, 1, 2)
    mixed_precision: str = "no"  # training autocast ("no" | "bf16" | "auto"); evaluation fp32
    timing_batches: int = 4
    timing_repeats: int = 5
    analysis_batches: int = 4
    threads: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("max_length", "after_layer", "epochs", "batch_size", "eval_batch_size",
                     "timing_repeats", "analysis_batches"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: an integer >= 1, got {v!r}")
        if not self.budgets:
            raise ValueError("budgets: give at least one token budget k")
        for k in self.budgets:
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < self.max_length:
                raise ValueError(f"budgets: integers in [1, max_length={self.max_length}), "
                                 f"got {k!r}")
        if len(set(self.budgets)) != len(self.budgets):
            raise ValueError(f"budgets: repeated value in {self.budgets}")
        if self.timing_batches < 0:
            raise ValueError(f"timing_batches: must be >= 0, got {self.timing_batches}")
        check_training_fields(self)


def budget_label(k: int) -> str:
    return f"k{k}"


def check_equal_lengths(loader, max_length: int) -> None:
    """A budget k is ρ = k / max_length only if every row has max_length real tokens."""
    row = 0
    for b in loader:
        n = b["attention_mask"].sum(1)
        short = (n != max_length).nonzero().flatten()
        if len(short):
            i = int(short[0])
            raise ValueError(f"data: test row {row + i} has {int(n[i])} tokens, not "
                             f"max_length={max_length}; an absolute budget k needs rows of "
                             f"equal length (lower max_length or use longer texts)")
        row += len(n)


@torch.no_grad()
def attention_by_layer(model, batches, max_batches: int) -> dict:
    """Mean Gini and entropy (bits) of every attention row per layer, from the attention
    modules' eager weights (forward hooks: they see the pruned layers' k × k attention too).
    Rows are unpadded here (equal lengths, all kept), so every row and key counts."""
    from attnprune.attention import row_entropy_bits
    from attnprune.research.analysis import attention_modules, row_gini

    previous = attn_implementation(model.config)
    model.set_attn_implementation("eager")
    mods = attention_modules(model)
    sums = np.zeros((len(mods), 3))  # gini, entropy, rows
    keys = np.zeros(len(mods))

    def hook(i):
        def fn(_m, _inp, out):
            p = out[1].float()  # (B, H, q, k)
            sums[i] += [float(row_gini(p, torch.ones_like(p, dtype=torch.bool)).sum()),
                        float(row_entropy_bits(p).sum()), p[..., 0].numel()]
            keys[i] = p.shape[-1]
        return fn

    handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(mods)]
    try:
        model.eval()
        for n, b in enumerate(batches):
            if n >= max_batches:
                break
            model(**{k: v for k, v in b.items() if k in ("input_ids", "attention_mask",
                                                          "token_type_ids")})
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation(previous)
    rows = np.maximum(sums[:, 2], 1)
    return {"gini_by_layer": (sums[:, 0] / rows).tolist(),
            "entropy_bits_by_layer": (sums[:, 1] / rows).tolist(), "keys_by_layer": keys.tolist()}


def run_seed(cfg: BudgetConfig, seed: int, data, results: ResultsDir) -> dict:
    """Fine-tune the full model, then score it and every budget k (predictions saved)."""
    from attnprune.research.finetune.loaders import make_loader
    from attnprune.research.finetune.model_io import load_model
    from attnprune.research.finetune.scoring import evaluate
    from attnprune.train import fit

    torch.manual_seed(seed)
    model, tok = load_model(cfg.model, data.n_classes)
    test = make_loader(data.test, tok, cfg.eval_batch_size, cfg.max_length, False, 0, cfg.max_eval)
    check_equal_lengths(test, cfg.max_length)
    train = make_loader(data.train, tok, cfg.batch_size, cfg.max_length, True, seed, cfg.max_train)
    history = fit(model, train, epochs=cfg.epochs, lr=cfg.lr, progress=cfg.progress,
                  desc=f"full seed {seed}", mixed_precision=cfg.mixed_precision)
    model.eval()
    full = evaluate(model, test, progress=cfg.progress, desc="full test")
    results.save_predictions(FULL, seed, full["y_true"], full["y_pred"], full["probs"])
    full_flops = full["flops"]["measured"]
    out = {"seed": seed, "history": history,
           FULL: {**{k: v for k, v in full.items() if k not in ("y_true", "y_pred", "probs")},
                  "attention": attention_by_layer(model, test, cfg.analysis_batches)},
           "budgets": {}}
    for k in cfg.budgets:
        pruned = copy.deepcopy(model)
        api.patch(pruned, "attention_mass", keep_ratio=k / cfg.max_length,
                  after_layer=cfg.after_layer)
        ev = evaluate(pruned, test, full_flops=full_flops, timing_batches=cfg.timing_batches,
                      timing_repeats=cfg.timing_repeats, full_model=model,
                      progress=cfg.progress, desc=f"k={k} test")
        results.save_predictions(budget_label(k), seed, ev["y_true"], ev["y_pred"], ev["probs"])
        out["budgets"][str(k)] = {
            "k": k, "keep_ratio": k / cfg.max_length,
            **{key: v for key, v in ev.items() if key not in ("y_true", "y_pred", "probs")},
            "attention": attention_by_layer(pruned, test, cfg.analysis_batches)}
        del pruned
    results.save_run(f"seed{seed}", out)
    return out


def summarize(cfg: BudgetConfig, records: dict, results: ResultsDir) -> dict:
    """summary.json, table1.md and table2.md from the finished seeds."""
    from attnprune.runs.compare import load_predictions

    seeds = sorted(records)
    preds = load_predictions(results.path / "predictions")
    cmp = []
    for s in seeds:
        group = {lab: by[s] for lab, by in preds.items() if s in by}
        if FULL in group and len(group) > 1:
            cmp += [{**c, "seed": s} for c in stats.compare_predictions(
                group, reference=FULL, adjust=False, metrics=("accuracy",))]
    if cmp:
        stats.apply_decision_rule(cmp)
    def acc(entries):  # one seed: its Wilson interval; several: the t-interval over seeds
        return stats.aggregate_seeds(
            [e["accuracy"] for e in entries],
            [list(stats.wilson_ci(round(e["accuracy"] * e["n"]), e["n"])[:2]) for e in entries])

    n_layers = len(records[seeds[0]][FULL]["attention"]["gini_by_layer"])
    after = list(range(cfg.after_layer, n_layers))  # layers that see the kept tokens only

    def attn(entries):
        a = [e["attention"] for e in entries]
        g = np.array([x["gini_by_layer"] for x in a])
        h = np.array([x["entropy_bits_by_layer"] for x in a])
        return {"gini_pruned_layers": float(g[:, after].mean()), "gini_all": float(g.mean()),
                "entropy_pruned_layers": float(h[:, after].mean()),
                "entropy_all": float(h.mean()),
                "keys_pruned_layers": float(np.mean([x["keys_by_layer"][after[0]] for x in a])),
                "gini_by_layer": g.mean(0).tolist(), "entropy_bits_by_layer": h.mean(0).tolist()}

    fulls = [records[s][FULL] for s in seeds]
    rows = [{"label": FULL, "k": cfg.max_length, "keep_ratio": 1.0,
             "accuracy": acc(fulls),
             "gflops_per_example": float(np.mean([f["flops"]["measured"] / f["n"] / 1e9
                                                  for f in fulls])),
             "flops_relative": 1.0, "time_relative": 1.0, **attn(fulls)}]
    for k in cfg.budgets:
        es = [records[s]["budgets"][str(k)] for s in seeds]
        cs = sorted((c for c in cmp if c["a"] == budget_label(k)), key=lambda c: c["seed"])
        rows.append({"label": budget_label(k), "k": k, "keep_ratio": k / cfg.max_length,
                     "accuracy": acc(es),
                     # one seed: the paired bootstrap interval of its McNemar comparison
                     "delta": stats.aggregate_seeds([c["diff"] for c in cs],
                                                    [c["ci95"] for c in cs]),
                     "p_holm": [c["p_holm"] for c in cs],
                     "gflops_per_example": float(np.mean([e["flops"]["measured"] / e["n"] / 1e9
                                                          for e in es])),
                     "flops_relative": float(np.mean([e["flops"]["relative"] for e in es])),
                     "time_relative": (float(np.mean([e["time"]["relative"] for e in es]))
                                       if all("time" in e for e in es) else None),
                     **attn(es)})
    summary = {"command": "token budget", "env": env_info(), "config": to_dict(cfg),
               "seeds": seeds, "rows": rows, "comparisons": cmp}
    results.write_json("summary.json", summary)
    results.write_text("table1.md", format_table1(cfg, rows, seeds))
    results.write_text("table2.md", format_table2(cfg, rows, seeds))
    return summary


def format_table1(cfg: BudgetConfig, rows: list[dict], seeds: list[int]) -> str:
    lines = [(f"Seeds {seeds}; {cfg.data}, every row {cfg.max_length} tokens; attention_mass "
              f"after layer {cfg.after_layer}, no retraining. Accuracy: mean [t-interval over "
              f"seeds; one seed: Wilson]; Δ: per seed on the same test rows, mean [t-interval; "
              f"one seed: paired bootstrap]; p Holm: McNemar "
              f"per seed (in seed order), Holm over the table. FLOPs counted over the test set; "
              f"time relative to the full model, interleaved."), "",
             "| budget k | ρ | accuracy | Δ vs full | p Holm | GFLOPs / example | FLOPs rel | time rel |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        full = r["label"] == FULL
        lines.append(
            f"| {'full (' + str(r['k']) + ')' if full else r['k']} | {r['keep_ratio']:.4g} | "
            f"{fmt_mean_ci(r['accuracy'])} | {'—' if full else fmt_mean_ci(r['delta'], '{:+.4f}')} | "
            f"{'—' if full else ', '.join(f'{p:.2g}' for p in r['p_holm'])} | "
            f"{r['gflops_per_example']:.3f} | {r['flops_relative']:.3f} | "
            f"{'—' if r['time_relative'] is None else format(r['time_relative'], '.3f')} |")
    return "\n".join(lines) + "\n"


def format_table2(cfg: BudgetConfig, rows: list[dict], seeds: list[int]) -> str:
    lines = [(f"Seeds {seeds} (means). Pruned layers: layers {cfg.after_layer + 1}–, which "
              f"attend over the k kept tokens; all layers: every layer of the model. Entropy in "
              f"bits; log2 k is its ceiling over k keys."), "",
             ("| budget k | keys seen (pruned layers) | log2 k | entropy, pruned layers | "
              "Gini, pruned layers | entropy, all layers | Gini, all layers |"),
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {'full (' + str(r['k']) + ')' if r['label'] == FULL else r['k']} | "
                     f"{r['keys_pruned_layers']:.0f} | {np.log2(r['keys_pruned_layers']):.2f} | "
                     f"{r['entropy_pruned_layers']:.3f} | {r['gini_pruned_layers']:.3f} | "
                     f"{r['entropy_all']:.3f} | {r['gini_all']:.3f} |")
    return "\n".join(lines) + "\n"


def run(cfg: BudgetConfig, results: ResultsDir) -> dict:
    from attnprune.research.data.text import load_text_data

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = load_text_data(cfg.data)
    records = {}
    for seed in cfg.seeds:
        key = f"seed{seed}"
        if results.run_done(key):
            records[seed] = results.load_run(key)
            print(f"skip {key}: finished earlier")
            continue
        records[seed] = run_seed(cfg, seed, data, results)
        summarize(cfg, records, results)
    return summarize(cfg, records, results)


def main(argv: list[str]) -> int:
    """CLI entry: ``[--config FILE] [--key value ...] --out DIR``."""

    def body(cfg, out) -> str:
        run(cfg, out)
        return (out.path / "table1.md").read_text() + "\n" + (out.path / "table2.md").read_text()

    return run_command(argv, BudgetConfig, "token-budget", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
