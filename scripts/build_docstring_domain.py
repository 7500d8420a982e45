"""Build the ``docstring_domain`` long-text benchmark (``attnprune.research.data.docstring_domain``).

    python scripts/build_docstring_domain.py --download      # fetch the pinned wheels (PyPI)
    python scripts/build_docstring_domain.py                 # build offline from them

The wheels go to ``--wheels`` (default ``$ATTNPRUNE_CACHE/docstring_domain/wheels``), fetched
one by one with ``pip download --no-deps --only-binary :all: --platform manylinux2014_x86_64
--python-version 3.11 NAME==VERSION`` (the files whose sha256 the table pins, on any machine).
The corpus (``docstring_domain.jsonl``) and ``manifest.json`` (its sha256, counts per split /
class / package, versions, licences and trove topics of the wheels) go to ``--out`` (default
the loader's folder). Prints the counts and the sha256, and whether it is the pinned one.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from attnprune.research.data import docstring_domain as dd


def download(folder: Path) -> None:
    """``pip download`` every pinned wheel not yet in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, version, _, _ in dd.PACKAGES:
        if dd.find_wheel(folder, name, version) is not None:
            continue
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--platform", "manylinux2014_x86_64", "--python-version", "3.11",
               f"{name}=={version}", "-d", str(folder)]
        print(" ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True)


def wheel_metadata(path: Path) -> dict:
    """Licence and ``Topic ::`` classifiers from a wheel's METADATA (for the manifest)."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode("utf-8", "replace").splitlines()
    lic = next((ln.split(":", 1)[1].strip() for ln in lines
                if ln.startswith(("License-Expression:", "License:"))), "")
    return {"file": path.name, "license": lic[:80],
            "license_classifiers": [ln.split("License ::", 1)[1].strip() for ln in lines
                                    if ln.startswith("Classifier: License ::")],
            "topics": [ln.split("Topic ::", 1)[1].strip() for ln in lines
                       if ln.startswith("Classifier: Topic ::")]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", type=Path, default=dd.default_path().parent / "wheels")
    ap.add_argument("--out", type=Path, default=dd.default_path().parent)
    ap.add_argument("--download", action="store_true", help="fetch missing wheels with pip first")
    args = ap.parse_args(argv)
    if args.download:
        download(args.wheels)
    t0 = time.time()
    stats: dict = {}
    rows = dd.build_rows(args.wheels, dd.minilm_token_counter(), stats=stats)
    import platform

    import tokenizers
    import transformers

    meta = {p[0]: {"version": p[1], "domain": p[2], "sha256": p[3],
                   **stats[p[0]], **wheel_metadata(dd.find_wheel(args.wheels, p[0], p[1]))}
            for p in dd.PACKAGES}
    m = dd.write_corpus(rows, args.out, {
        "python": platform.python_version(), "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__, "words_per_passage": dd.WORDS_PER_PASSAGE,
        "min_tokens": dd.MIN_TOKENS, "max_per_package": dd.MAX_PER_PACKAGE, "packages": meta})
    for s, d in m["describe"].items():
        print(f"{s}: {d['n']} passages (" + ", ".join(f"{c} {n}" for c, n in d["classes"].items())
              + f"), {len(d['packages'])} packages")
    print(f"windows of {dd.WORDS_PER_PASSAGE} words: {sum(v['windows'] for v in stats.values())}, "
          f"under {dd.MIN_TOKENS} tokens: {sum(v['short'] for v in stats.values())}")
    print(f"wrote {args.out / dd.FILE} ({m['rows']} rows) in {time.time() - t0:.0f} s")
    print(f"sha256 {m['sha256']}"
          + ("" if not dd.EXPECTED_SHA256 else
             " (the pinned one)" if m["sha256"] == dd.EXPECTED_SHA256 else
             f" (differs from the pinned {dd.EXPECTED_SHA256})"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
