"""The ``attnprune`` command line: a thin dispatcher.

    attnprune <command> [--config FILE.yaml] [--key value ...] --out DIR

Each command lives in its own module as ``main(argv) -> int`` that parses its options into a
frozen config and calls one library function; modules are imported only when their command
runs, so ``attnprune --help`` is instant.
"""

from __future__ import annotations

import importlib
import sys

from attnprune.runs.config import ConfigError, close_names, command_line_message, plain, print_help

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
    ("reproduce", "long-tasks"): ("attnprune.research.experiments.long_tasks:main",
                                  "FastV / GemFilter vs controls on the long-context task suite"),
    ("finetune",): ("attnprune.research.finetune:main", "fine-tune and evaluate an HF encoder with a method"),
    ("pareto",): ("attnprune.research.pareto:main",
                  "accuracy–latency front: full, layer-drop, int8, token pruning, composed"),
    ("embed-front",): ("attnprune.research.embed_front:main",
                        "sentence embeddings: pruned vs depth vs ONNX int8 on the retrieval benchmark"),
    ("lm",): ("attnprune.research.lm:main",
              ("train / evaluate a causal LM with a method: GPT-2, Llama, Mistral, Qwen2, Qwen3, "
               "Gemma, Gemma2, Phi-3")),
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
    ("embed-distill",): ("attnprune.research.embed_distill:main",
                         "distill a token-pruned SentenceTransformer on unlabeled texts"),
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
    """The config dataclass of a command module: its ``CONFIG`` ("module:Class", for a module
    that imports its config lazily), else the one class named ``...Config`` made by
    ``@dataclass`` in that module, or None (commands without a config)."""
    import dataclasses

    named = getattr(module, "CONFIG", None)
    if isinstance(named, str):
        mod, cls = named.split(":")
        return getattr(importlib.import_module(mod), cls)
    found = [v for n, v in vars(module).items() if isinstance(v, type) and n.endswith("Config")
             and dataclasses.is_dataclass(v) and v.__module__ == module.__name__]
    return found[0] if len(found) == 1 else None


def methods_main(argv: list[str]) -> int:
    """List the registered methods, one line each: name, kind and summary. The kind says
    where a method acts: token (between layers: drops tokens), attention (inside attention:
    masks or scales scores) or loss (in the loss: an auxiliary penalty). No options."""
    if "-h" in argv or "--help" in argv:
        import inspect

        print(f"usage: attnprune methods\n\n{inspect.cleandoc(methods_main.__doc__)}")
        return 0
    if argv:
        print(f"attnprune methods: error: takes no options, got {' '.join(argv)!r}", file=sys.stderr)
        return 2
    from attnprune.methods import registry
    for name in registry.list_methods():
        spec = registry.get(name)
        print(f"{name:<20} {spec.kind:<10} {spec.summary}")
    return 0


def _group_usage(word: str) -> str:
    """The subcommands of a command group (``reproduce``, ``bench``)."""
    lines = [f"usage: attnprune {word} <subcommand> [--key value ...] [--out DIR]", "",
             "subcommands:"]
    for words, (_, text) in COMMANDS.items():
        if words[0] == word and len(words) > 1:
            lines.append(f"  {' '.join(words[1:]):<14} {text}")
    lines += ["", f"Run 'attnprune {word} <subcommand> --help' for its options."]
    return "\n".join(lines)


def command_help(words: tuple[str, ...]) -> int:
    """``attnprune <words> --help``: the command's docstring as plain text and every option
    with its default (the run flags --config, --out, --exact-out too, where it takes them).
    A command without a config dataclass prints its own help (``main(["--help"])``)."""
    target, summary = COMMANDS[words]
    module, func = target.split(":")
    mod = importlib.import_module(module)
    cls = config_class(mod)
    if cls is None:
        try:
            return int(getattr(mod, func)(["--help"]) or 0)
        except SystemExit as e:  # argparse's --help
            return int(e.code or 0)
    doc = (mod.__doc__ or "").strip()
    name = f"attnprune {' '.join(words)}"
    if name not in plain(doc.split("\n", 1)[0]):  # a docstring that does not name its command
        doc = f"{name}: {summary}\n\n{doc}"
    print_help(doc, cls, extra=getattr(mod, "EXTRA_FLAGS", ()))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv_from_process = argv is None  # the program itself, not a caller inside Python
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # a usage error, as argparse treats a missing command (exit 2)
        print(_usage(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help", "help"):
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
                return command_help(words)
            from attnprune.runs.results import last_run_dir, sticky_ctrl_c

            last_run_dir(forget=True)  # a folder of an earlier command in this process
            try:
                if not argv_from_process:
                    return int(fn(rest) or 0)
                with sticky_ctrl_c():  # a Ctrl-C that Python drops still stops the command
                    return int(fn(rest) or 0)
            except ConfigError as e:
                name = " ".join(words)
                print(f"attnprune {name}: error: {command_line_message(e, rest, name)}",
                      file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                if argv_from_process:
                    # the program is ending: a second Ctrl-C during interpreter shutdown
                    # (atexit joins) would print a traceback instead of this one line
                    import signal

                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                print(f"\n{_interrupted(words)}", file=sys.stderr)
                return 130
    groups = {w[0] for w in COMMANDS if len(w) > 1}
    if argv[0] in groups:  # "attnprune bench", "attnprune bench --help", "attnprune bench x"
        if len(argv) == 1 or argv[1] in ("-h", "--help", "help"):
            print(_group_usage(argv[0]))
            return 0
        print(f"attnprune: unknown command {' '.join(argv[:2])!r}{_did_you_mean(argv)}\n\n"
              f"{_group_usage(argv[0])}", file=sys.stderr)
        return 2
    print(f"attnprune: unknown command {' '.join(argv[:2])!r}{_did_you_mean(argv)}\n\n"
          f"{_usage()}", file=sys.stderr)
    return 2


def _interrupted(words: tuple[str, ...]) -> str:
    """The one line a Ctrl-C ends a command with. Where it had opened a results folder, the
    exact command that resumes it: ``--out`` that folder (its config.yaml supplies the
    options); the ``--out`` first given would make a new timestamped folder and start over."""
    import shlex

    from attnprune.runs.results import last_run_dir

    folder = last_run_dir()
    if folder is None or not (folder / "config.yaml").is_file():
        return "interrupted before any results were saved"
    return (f"interrupted: finished runs are saved in {folder}; resume with: "
            f"attnprune {' '.join(words)} --out {shlex.quote(str(folder))}")


def _did_you_mean(argv: list[str]) -> str:
    """``"; did you mean 'finetune'?"`` for a mistyped command word (difflib), else ``""``."""
    if argv[0] in {w[0] for w in COMMANDS if len(w) > 1} and len(argv) > 1:  # "bench encodr"
        group = [w[1] for w in COMMANDS if w[0] == argv[0] and len(w) > 1]
        close = [f"{argv[0]} {c}" for c in close_names(argv[1], group, n=1)]
    else:
        close = close_names(argv[0], list(dict.fromkeys(w[0] for w in COMMANDS)), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
