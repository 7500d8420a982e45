"""One shape for the commands' ``main(argv)``: parse the options into the command's config,
open its results folder, run, print, and end with the folder's path.

    def main(argv):
        return run_command(argv, BenchFlexConfig, "bench-flex",
                           lambda cfg, out: save_table(out, run(cfg), format_table))

Options are parsed (and bad ones refused, exit 2 through the dispatcher) before the folder is
made; ``body(config, results_dir)`` does the work and returns the text to print (or None).
"""

from __future__ import annotations

from collections.abc import Callable

from attnprune.runs.config import parse_command_line
from attnprune.runs.results import ResultsDir

__all__ = ["run_command", "save_table"]


def run_command(argv: list[str], config_cls: type, name: str,
                body: Callable[[object, ResultsDir], str | None],
                default_out: str = "results") -> int:
    """``parse_command_line`` → ``ResultsDir.start(out, name)`` → ``body`` → print its text and
    ``results: <folder>``; returns the exit code 0."""
    cl = parse_command_line(argv, config_cls, default_out=default_out)
    out = ResultsDir.start(cl.out, name, cl.exact_out, cl.config)
    text = body(cl.config, out)
    if text:
        print(text)
    print(f"results: {out.path}")
    return 0


def save_table(out: ResultsDir, summary: dict, format_table: Callable[[dict], str],
               table_file: str = "table.md") -> str:
    """Write ``summary.json`` and the table ``format_table(summary)``; returns the table."""
    out.write_json("summary.json", summary)
    table = format_table(summary)
    out.write_text(table_file, table + "\n")
    return table
