"""The ``attnprune`` command line: a thin dispatcher (contract in DESIGN.md).

    attnprune <command> [--config FILE.yaml] [--key value ...] --out DIR

Each command lives in its own module as ``main(argv) -> int`` that parses its options into a
frozen config and calls one library function; modules are imported only when their command
runs, so ``attnprune --help`` is instant.
"""

from __future__ import annotations

import importlib
import sys

from attnprune.runs.config import ConfigError, print_help

# command words → "module:function" taking the remaining argv
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("reproduce", "synthetic"): ("attnprune.research.synthetic.cli:main",
                                 "the entropy-pruning paper's synthetic track, trained for real"),
    ("reproduce", "attention"): ("attnprune.research.experiments.attention_sweeps:main",
                                 "crisp sparsity and compute-cost λ sweeps vs dense (MiniLM, tweets)"),
    ("reproduce", "budget"): ("attnprune.research.experiments.token_budget:main",
                              "the cost paper's Tables 1-2: accuracy, FLOPs, Gini, entropy vs k"),
    ("reproduce", "intensity"): ("attnprune.research.experiments.intensity_runs:main",
                                 "the intensity paper's Runs 0–4 on shakespeare_char, seeds, Holm"),
    ("finetune",): ("attnprune.research.finetune:main", "fine-tune and evaluate an HF encoder with a method"),
    ("pareto",): ("attnprune.research.pareto:main",
                  "accuracy–latency front: full, layer-drop, int8, token pruning, composed"),
    ("lm",): ("attnprune.research.lm:main", "train / evaluate a causal LM (GPT-2 family) with a method"),
    ("bench", "encoder"): ("attnprune.bench.encoder:main", "speed and FLOPs of token pruning on an encoder"),
    ("bench", "attention"): ("attnprune.bench.attention:main", "speed of attention-level methods"),
    ("bench", "lm"): ("attnprune.bench.lm:main", "speed and FLOPs of causal-LM token pruning"),
    ("bench", "prefill"): ("attnprune.bench.prefill:main",
                           "time to first token: FastV / GemFilter prefill pruning vs the stock prefill"),
    ("bench", "gpu"): ("attnprune.bench.gpu:main",
                       "full vs pruned vs shallower vs int8 on a GPU in bf16 (or --device cpu)"),
    ("bench", "flex"): ("attnprune.bench.flex:main",
                        "crisp through a block-sparse kernel (FlexAttention) vs dense SDPA"),
    ("bench", "sparse-ffn"): ("attnprune.bench.sparse_ffn:main",
                              "break-even of the sparse FFN second projection (sparsity → time, FLOPs)"),
    ("report",): ("attnprune.runs.report:main", "(re)build the HTML report of a results folder"),
    ("compare",): ("attnprune.runs.compare:main", "paired comparison table from saved predictions"),
    ("methods",): ("attnprune.cli:methods_main", "list the registered methods"),
}


def _usage() -> str:
    lines = ["usage: attnprune <command> [--config FILE.yaml] [--key value ...] [--out DIR]", "", "commands:"]
    for words, (_, text) in COMMANDS.items():
        lines.append(f"  {' '.join(words):<20} {text}")
    lines.append("")
    lines.append("Run 'attnprune <command> --help' for a command's options.")
    return "\n".join(lines)


def config_class(module) -> type | None:
    """The config dataclass a command module defines (the one class named ``...Config`` made
    by ``@dataclass`` in that module), or None (commands without options)."""
    import dataclasses

    found = [v for n, v in vars(module).items() if isinstance(v, type) and n.endswith("Config")
             and dataclasses.is_dataclass(v) and v.__module__ == module.__name__]
    return found[0] if len(found) == 1 else None


def methods_main(argv: list[str]) -> int:
    """``attnprune methods``: one line per registered method."""
    from attnprune.methods import registry
    for name in registry.list_methods():
        spec = registry.get(name)
        print(f"{name:<20} {spec.kind:<10} {spec.summary}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv_from_process = argv is None  # the program itself, not a caller inside Python
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    for words in sorted(COMMANDS, key=len, reverse=True):
        if tuple(argv[: len(words)]) == words:
            target, _ = COMMANDS[words]
            module, func = target.split(":")
            try:
                fn = getattr(importlib.import_module(module), func)
            except (ImportError, AttributeError) as e:
                print(f"attnprune: command '{' '.join(words)}' is not available: {e}", file=sys.stderr)
                return 2
            rest = argv[len(words):]
            if "-h" in rest or "--help" in rest:
                # Every command documents itself in its module docstring, and its options in
                # its config dataclass: both, with each option's default
                mod = importlib.import_module(module)
                doc = f"attnprune {' '.join(words)}\n\n{(mod.__doc__ or '').strip()}\n"
                cls = config_class(mod)
                if cls is None:
                    print(doc)
                else:
                    print_help(doc, cls)
                return 0
            try:
                return int(fn(rest) or 0)
            except ConfigError as e:
                print(f"attnprune {' '.join(words)}: error: {e}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                if argv_from_process:
                    # the program is ending: a second Ctrl-C during interpreter shutdown
                    # (atexit joins) would print a traceback instead of this one line
                    import signal

                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                print("\ninterrupted: finished runs are saved; rerun with the same --out to resume",
                      file=sys.stderr)
                return 130
    print(f"attnprune: unknown command {' '.join(argv[:2])!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
