"""Merge ``attnprune pareto`` results folders of the same config run seed by seed elsewhere
(e.g. on a GPU machine, one folder per seed) into one folder:

    python scripts/merge_results.py DEST SRC [SRC ...]

Copies ``runs/*.json`` and ``predictions/*.npz`` (never overwriting a file DEST already has)
and ``config.yaml`` / ``data.json`` / ``search.json`` from the first SRC when DEST has none (a
``search.json`` that differs between folders is an error); the seeds of DEST's
config become the union of all seeds found. Then run ``attnprune pareto --out DEST --phase
time`` (and ``--phase summary``) where the latency matters.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml


def merge(dest: Path, sources: list[Path]) -> list[int]:
    dest.mkdir(parents=True, exist_ok=True)
    seeds: set[int] = set()
    for src in sources:
        if not (src / "config.yaml").is_file():
            raise SystemExit(f"{src}: not a results folder (no config.yaml)")
        for name in ("config.yaml", "data.json", "search.json"):
            if not (dest / name).is_file() and (src / name).is_file():
                shutil.copy2(src / name, dest / name)
        # searched schedules (schedule: search) must be one per folder: every seed trained on it
        if (src / "search.json").is_file() and (dest / "search.json").read_text() != (
                src / "search.json").read_text():
            raise SystemExit(f"{src}: its search.json differs from {dest}'s: its seeds trained "
                             "other searched schedules, so they are not one point")
        seeds |= set(yaml.safe_load((src / "config.yaml").read_text()).get("seeds", []))
        for sub in ("runs", "predictions"):
            (dest / sub).mkdir(exist_ok=True)
            for f in sorted((src / sub).glob("*")):
                if not (dest / sub / f.name).exists():
                    shutil.copy2(f, dest / sub / f.name)
    cfg = yaml.safe_load((dest / "config.yaml").read_text())
    cfg["seeds"] = sorted(seeds | set(cfg.get("seeds", [])))
    (dest / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg["seeds"]


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        raise SystemExit(2)
    print("seeds:", merge(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]))
