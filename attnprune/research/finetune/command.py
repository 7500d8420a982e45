"""``attnprune finetune``'s ``main(argv)``: parse the options (process 0, sent to the others),
check the data and model, open the results folder, run, print each label's line."""

from __future__ import annotations

import torch

from attnprune.research.finetune.config import FinetuneConfig
from attnprune.research.finetune.model_io import FULL
from attnprune.research.finetune.summary import HEADLINE
from attnprune.research.finetune.training import prepare, run
from attnprune.runs import distributed
from attnprune.runs.config import parse_command_line

__all__ = ["cost_text", "main"]


def cost_text(label: str, entry: dict) -> str:
    """The printed cost ratios of one summary row against the full model, padded then fair:
    ``FLOPs 0.435 (fair 0.497)  time 0.495 (fair 0.62)``. A ratio not measured says so
    (``fair not counted``, ``not timed``: the no-retrain row is timed on neither batches),
    never ``None``; the full row's ratios are 1 by definition (it is the denominator)."""
    fl, tr = (entry.get("flops") or {}), (entry.get("time") or {})
    time_rel = tr.get("relative")
    if time_rel is None and label == FULL:
        time_rel = 1.0  # the reference (the denominator): its ratio to itself, as its FLOPs'

    def pair(name: str, rel, fair, missing: str) -> str:
        if rel is None and fair is None:
            return missing if name == "time" else f"{name} {missing}"

        def r3(x):
            return missing if x is None else round(x, 3)
        return f"{name} {r3(rel)} (fair {r3(fair)})"

    return (f"{pair('FLOPs', fl.get('relative'), fl.get('relative_fair'), 'not counted')}  "
            f"{pair('time', time_rel, tr.get('relative_fair'), 'not timed')}")


def main(argv: list[str]) -> int:
    """``attnprune finetune [--config FILE] [--key value ...] --out DIR``."""
    if "--help" in argv or "-h" in argv:
        from attnprune.research import finetune  # the package: its docstring is the help
        from attnprune.runs.config import print_help

        print_help(finetune.__doc__, FinetuneConfig)  # with --config, --out, --exact-out
        return 0
    # parsed by process 0 (which may read a resumed folder's files) and sent to the others:
    # every process runs the same configuration
    cl = distributed.on_main(parse_command_line, argv, FinetuneConfig)
    cfg = cl.config
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = prepare(cfg)  # every data / model problem stops here, before the results folder
    results = distributed.start_results(cl.out, "finetune", cl.exact_out, cfg)
    summary = run(cfg, results, data)
    main_process = distributed.is_main()
    distributed.finish()  # every process done with collectives: end the group before exit
    if not main_process:
        return 0
    head = HEADLINE[summary.get("task", "classification")]
    nan = float("nan")
    for label, e in sorted(summary["methods"].items()):
        acc = e.get(head, {})
        ci = [nan if v is None else v for v in acc.get("ci95") or [nan, nan]]
        mcc = (e.get("mcc") or {}).get("mean")
        extra = f"  mcc {mcc:.4f}" if mcc is not None else ""
        print(f"{label:<40} {head} {acc.get('mean', nan):.4f} "
              f"[{ci[0]:.4f}, {ci[1]:.4f}]{extra}  kept {e['kept_ratio']:.3f}  "
              f"{cost_text(label, e)}")
    for c in summary["comparisons"]:
        if c["metric"] in (head, "mcc", "spearman"):
            print(f"{c['a']} vs {c['b']} (seed {c['seed']}): Δ{c['metric']} {c['diff']:+.4f} "
                  f"CI [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}] {c['test']} p {c['p']:.3g} "
                  f"p_holm {c['p_holm']:.3g}")
    for line in summary.get("comparisons_skipped", []):
        print(f"not compared: {line}")
    for line in summary.get("warnings", []):
        print(f"warning: {line}")
    from attnprune.runs.report import build

    print(f"report → {build(results.path)}")
    return 0
