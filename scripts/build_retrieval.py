"""Build the docstring retrieval benchmark (``attnprune.research.data.retrieval``) offline from
the installed packages of its table.

    python scripts/build_retrieval.py --out DIR

Writes the JSONL files and ``manifest.json`` (sha256 of every file, counts, token lengths, the
packages' versions, this command) into ``DIR``; prints the counts and the build time. The
same command with the same installed versions writes byte-identical files: before any work it
checks the installed versions against the committed manifest
(``docs/results/retrieval_benchmark/manifest.json``) and, when one is missing or differs, says in
one line what to install (the ``bench`` extra pins the packages ``.[dev]`` lacks) and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import platform
import sys
import time
import tomllib
from pathlib import Path

from attnprune.research.data import retrieval as rt

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "docs/results/retrieval_benchmark/manifest.json"


def install_command(wanted: list[str]) -> str:
    """``pip install -e '.[bench]'`` when the bench extra pins every one of ``wanted``, else
    ``pip install name==version ...``."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bench = {r.lower() for r in extras["optional-dependencies"]["bench"]}
    if {w.lower() for w in wanted} <= bench:
        return "pip install -e '.[bench]'"
    return "pip install " + " ".join(wanted)


def version_problems(manifest: Path = MANIFEST) -> tuple[list[str], list[str]]:
    """The manifest's packages (and tokenizers) that are missing or installed at another version:
    (``"name (missing)"`` / ``"name X, not Y"`` notes, ``name==Y`` pins). A local build tag
    (``+cpu``, ``+cu128``) is ignored: it does not change the sources read."""
    m = json.loads(manifest.read_text())
    pins = [p["version"] for p in m["packages"]] + [f"tokenizers=={m['tokenizers']}"]
    notes, wanted = [], []
    for pin in pins:
        name, want = pin.split("==")
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = None
        if have is None or have.split("+")[0] != want.split("+")[0]:
            notes.append(f"{name} (missing)" if have is None else f"{name} {have}, not {want}")
            wanted.append(f"{name}=={want.split('+')[0]}")
    return notes, wanted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the files")
    ap.add_argument("--site", type=Path, default=None,
                    help="site-packages folder to read (default: the one holding numpy)")
    ap.add_argument("--any-version", action="store_true",
                    help="build with installed versions other than the manifest's (the files "
                         "then differ from the committed sha256)")
    args = ap.parse_args(argv)
    notes, wanted = version_problems()
    missing = [n for n in notes if n.endswith("(missing)")]
    if missing or (notes and not args.any_version):
        print(f"build_retrieval: {len(notes)} package(s) missing or not at the manifest's "
              f"version ({'; '.join(notes)}); run: {install_command(wanted)}", file=sys.stderr)
        return 2
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
