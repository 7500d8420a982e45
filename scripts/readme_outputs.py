"""Regenerate the printed outputs the README's uses 2 and 3 quote, into docs/results/readme/.

    python scripts/readme_outputs.py [--out docs/results/readme] [--workdir DIR]

Builds ``reviews.csv`` (the first 600 rows of the shared ``tweets_sentiment.csv``, columns
``text,label``), runs the README's two ``attnprune finetune`` commands on it exactly as written
(1 thread), then its use-3 Python blocks against the folder they wrote, and saves what each
printed (``use2.txt``, ``use3_pipeline.txt``, ``use3_onnx.txt``) with ``reviews.md`` saying
where the CSV came from. ``tests/test_docs.py`` checks that the README quotes these files
word for word, so a stale README fails the suite.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = 600


def readme_blocks() -> list[tuple[str, str]]:
    """The code blocks of the README's "Three uses" section, in order: (language, body)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Three uses", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(python|bash)\n(.*?)```", section, flags=re.DOTALL)


def write_reviews(path: Path) -> None:
    data = Path(os.environ.get("ATTNPRUNE_DATA", ROOT.parent / "shared" / "data"))
    with open(data / "tweets_sentiment.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:ROWS]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for r in rows:
            w.writerow([r["text"], r["label"]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "readme"))
    ap.add_argument("--workdir", default=None, help="where reviews.csv and runs/ go "
                    "(default: a new temporary folder)")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="readme-"))
    work.mkdir(parents=True, exist_ok=True)
    write_reviews(work / "reviews.csv")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    blocks = readme_blocks()
    if [k for k, _ in blocks] != ["python", "bash", "python", "python"]:
        raise SystemExit("README: expected the uses' blocks python, bash, python, python")
    times = []
    stdout = ""
    for line in blocks[1][1].strip().splitlines():
        argv_ = shlex.split(line)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "attnprune", *argv_[1:], "--progress", "false"],
                           cwd=work, env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - t0)
        if r.returncode:
            raise SystemExit(f"{line}\nfailed:\n{r.stderr[-3000:]}")
        stdout = r.stdout  # the README quotes the second command's output
    (out / "use2.txt").write_text(stdout)
    for name, code in (("use3_pipeline.txt", blocks[2][1]),
                       ("use3_onnx.txt", blocks[2][1] + "\n" + blocks[3][1])):
        r = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True,
                           text=True, check=False)
        if r.returncode:
            raise SystemExit(f"{name} failed:\n{r.stderr[-3000:]}")
        lines = r.stdout.splitlines()
        text = "\n".join(lines[:2] if name == "use3_pipeline.txt" else lines[2:]) + "\n"
        (out / name).write_text(text)
    (out / "reviews.md").write_text(
        f"`reviews.csv`: the first {ROWS} rows of `tweets_sentiment.csv` from the shared data "
        f"folder (`$ATTNPRUNE_DATA`, else `../shared/data`), columns `text,label`.\n\n"
        f"Written by `python scripts/readme_outputs.py` (1 thread); the two finetune commands "
        f"took {times[0]:.0f} s and {times[1]:.0f} s.\n")
    print(f"wrote {out}: use2.txt, use3_pipeline.txt, use3_onnx.txt, reviews.md "
          f"(finetune {times[0]:.0f} s, {times[1]:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
