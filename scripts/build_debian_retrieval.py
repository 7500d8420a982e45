"""Build the Debian package-description retrieval benchmark
(``attnprune.research.data.debian_retrieval``, issue 45) offline from an apt lists folder.

    python scripts/build_debian_retrieval.py --out DIR [--lists /var/lib/apt/lists] [--families]

The folder needs the ``*_Packages`` files and, for the long descriptions, the
``*_i18n_Translation-en`` files (images that set ``Acquire::Languages "none"`` lack them).
Writes the JSONL files and ``manifest.json`` (sha256 of every file, counts, token lengths, the
list files read with their sha256, this command) into ``DIR``, loadable as ``retrieval:DIR``;
prints the counts and the build time. The same lists write byte-identical files.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from attnprune.research.data import debian_retrieval as dr
from attnprune.research.data import retrieval as rt
from attnprune.research.data.base import DataError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the files")
    ap.add_argument("--lists", type=Path, default=dr.DEFAULT_LISTS,
                    help=f"apt lists folder to read (default: {dr.DEFAULT_LISTS})")
    ap.add_argument("--families", action="store_true",
                    help="passages with the same first paragraph count as copies (one of a "
                         "family of binaries with boilerplate descriptions stays)")
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        read: dict = {}
        pkgs = dr.packages(args.lists, read)
        lists = dr.describe_lists(args.lists)
    except (FileNotFoundError, DataError) as e:
        print(f"build_debian_retrieval: {e}", file=sys.stderr)
        return 2
    import tokenizers
    import transformers

    tok = rt.minilm_tokenizer()
    stats: dict = {}
    rows = dr.build(pkgs, tok, families=args.families, stats=stats)
    command = "python scripts/build_debian_retrieval.py --out DIR"
    if args.lists != dr.DEFAULT_LISTS:
        command += " --lists LISTS"
    if args.families:
        command += " --families"
    m = rt.write_benchmark(rows, args.out, tok, {
        "command": command, "source": "Debian package descriptions (apt lists)",
        "split_rule": "sha256(source package)[:8] mod 100 against split_percent",
        "split_percent": dict(dr.SPLIT_PERCENT), "families": args.families,
        "python": platform.python_version(), "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__, "read": read, **stats, "lists": lists})
    for name, f in m["files"].items():
        t = f["tokens"]
        print(f"{name}: {f['rows']} rows from {len(f['groups'])} source packages"
              + (f"; tokens min {t['min']} median {t['median']:g} mean {t['mean']:g} max "
                 f"{t['max']}" if t else ""))
    print(f"dropped: {stats['dropped']}")
    print(f"wrote {args.out} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
