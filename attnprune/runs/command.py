"""One shape for the commands' ``main(argv)``: parse the options into the command's config,
open its results folder, run, print, and end with the folder's path.

    def main(argv):
        return run_command(argv, BenchFlexConfig, "bench-flex",
                           lambda cfg, out: save_table(out, run(cfg), format_table))

Options are parsed (and bad ones refused, exit 2 through the dispatcher) before the folder is
made; ``body(config, results_dir)`` does the work and returns the text to print (or None).
Where a command needs more, keywords say so, each step staying in this one place:

- ``defaults``: a preset under the options given (``reproduce synthetic --quick``);
- ``prepare(config)``: work that must stop a bad run before its folder exists (reading the
  data, setting the thread count); its result is ``body``'s third argument;
- ``announce``: the line that names the folder once it is open (``{}`` is its path);
- ``end_with_folder=False``: no closing ``results: <folder>`` line (the command's last line
  is its own, e.g. the table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnprune.runs.config import parse_command_line
from attnprune.runs.results import ResultsDir

__all__ = ["run_command", "save_table"]


def run_command(argv: list[str], config_cls: type, name: str | Callable[[Any], str],
                body: Callable[..., str | None], default_out: str = "results", *,
                defaults: dict[str, Any] | None = None,
                prepare: Callable[[Any], Any] | None = None,
                announce: str = "results: {}", end_with_folder: bool = True) -> int:
    """``parse_command_line`` → ``prepare(config)`` → ``ResultsDir.start(out, name)`` →
    ``body(config, folder[, prepared])`` → print its text and ``results: <folder>``; returns
    the exit code 0. ``name`` may be a function of the config (``attention-{sweep}``)."""
    cl = parse_command_line(argv, config_cls, default_out=default_out, defaults=defaults)
    prepared = () if prepare is None else (prepare(cl.config),)
    name = name(cl.config) if callable(name) else name
    out = ResultsDir.start(cl.out, name, cl.exact_out, cl.config, announce=announce)
    text = body(cl.config, out, *prepared)
    if text:
        print(text)
    if end_with_folder:
        print(f"results: {out.path}")
    return 0


def save_table(out: ResultsDir, summary: dict, format_table: Callable[[dict], str],
               table_file: str = "table.md") -> str:
    """Write ``summary.json`` and the table ``format_table(summary)``; returns the table."""
    out.write_json("summary.json", summary)
    table = format_table(summary)
    out.write_text(table_file, table + "\n")
    return table
