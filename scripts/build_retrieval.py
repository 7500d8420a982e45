"""Build the docstring retrieval benchmark (``attnprune.research.data.retrieval``) offline from
the installed packages of its table.

    python scripts/build_retrieval.py --out DIR

Writes the JSONL files and ``manifest.json`` (sha256 of every file, counts, token lengths, the
packages' versions, this command) into ``DIR``; prints the counts and the build time. The
same command with the same installed versions writes byte-identical files.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

from attnprune.research.data import retrieval as rt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the files")
    ap.add_argument("--site", type=Path, default=None,
                    help="site-packages folder to read (default: the one holding numpy)")
    args = ap.parse_args(argv)
    t0 = time.time()
    import tokenizers
    import transformers

    sources = rt.site_sources(rt.PACKAGES, args.site)
    tok = rt.minilm_tokenizer()
    stats: dict = {}
    rows = rt.build(sources, tok, stats=stats)
    m = rt.write_benchmark(rows, args.out, tok, {
        "command": "python scripts/build_retrieval.py --out DIR"
                   + ("" if args.site is None else " --site SITE"),
        "python": platform.python_version(), "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__,
        "packages": [{**rt.describe_source(s), **stats[s.group]} for s in sources]})
    for name, f in m["files"].items():
        t = f["tokens"]
        print(f"{name}: {f['rows']} rows from {len(f['groups'])} packages; tokens min {t['min']}"
              f" median {t['median']:g} mean {t['mean']:g} max {t['max']}")
    print(f"wrote {args.out} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
