"""``attnprune reproduce synthetic``: the entropy paper's synthetic track, trained for real.

    attnprune reproduce synthetic [--config configs/synthetic.yaml] [--key value ...]
                                  [--quick] [--out DIR] [--exact-out]

Parses the options into :class:`attnprune.research.synthetic.config.SyntheticConfig` (bad values stop here,
naming the field, before any work), sets the torch thread count (the caller's choice, so here
and not at import), runs :func:`attnprune.research.synthetic.run.run_experiment` into the results folder,
prints the Table-2-like table and builds ``report.html``.
``--quick`` is a smoke run (small data, 2 epochs, 2 seeds) with the same code path.
"""

from __future__ import annotations

import functools
import resource
import sys
import time

from attnprune.compat import cpu_has_bf16
from attnprune.runs.command import run_command
from attnprune.runs.results import ResultsDir

HELP = __doc__
# for ``attnprune reproduce synthetic --help`` (attnprune.cli.config_class): the config lives
# in config.py, imported only when the command runs
CONFIG = "attnprune.research.synthetic.config:SyntheticConfig"
EXTRA_FLAGS = (("--quick", "a smoke run (small data, 2 epochs, 2 seeds), same code path"),)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        from attnprune.research.synthetic.config import SyntheticConfig
        from attnprune.runs.config import print_help

        print_help(HELP, SyntheticConfig, extra=EXTRA_FLAGS)
        return 0
    quick = "--quick" in argv
    argv = [a for a in argv if a != "--quick"]

    from attnprune.research.synthetic.config import SyntheticConfig, quick_config
    from attnprune.research.synthetic.run import run_experiment

    return run_command(argv, SyntheticConfig, "reproduce synthetic",
                       functools.partial(_run, experiment=run_experiment), "results",
                       defaults=quick_config() if quick else None, prepare=_threads,
                       announce="results → {}" + ("  (quick smoke run)" if quick else ""),
                       end_with_folder=False)


def _threads(cfg) -> None:
    """The torch thread count, set before the results folder is opened."""
    import torch

    torch.set_num_threads(cfg.threads)
    if cfg.precision == "bf16" and not cpu_has_bf16():
        print("warning: precision: this CPU has no native bfloat16 matmuls, so bf16 training is "
              "emulated and may be slower than --precision fp32", file=sys.stderr)


def _run(cfg, results: ResultsDir, _: None, experiment) -> None:
    """Train and measure into ``results`` (``experiment``: ``run_experiment``); print the
    table, the times and the report's path."""
    from attnprune.research.synthetic.summary import format_table
    from attnprune.runs.report import build

    t0, c0 = time.perf_counter(), time.process_time()
    k = resource.getrusage(resource.RUSAGE_CHILDREN)
    k0 = k.ru_utime + k.ru_stime
    summary = experiment(cfg, results)
    print()
    print(format_table(summary))
    wall = time.perf_counter() - t0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\nwall time {wall:.1f} s (training {summary['train_seconds']:.1f} s); CPU time: "
          f"this process {time.process_time() - c0:.1f} s, worker processes "
          f"{kids.ru_utime + kids.ru_stime - k0:.1f} s; {cfg.workers} worker process(es) × "
          f"{cfg.threads} thread(s)")
    build(results.path)
    print(f"report → {results.path / 'report.html'}")
    print(f"results → {results.path}")
