"""Pack a GPU job's work folder into ONE tarball of at most ``--limit-mib`` (what a device call
brings back: ≤ 8 files of ≤ 16 MiB, ≤ 2 folders below $OUT; scripts/gpu/job.sh).

    python scripts/gpu/pack.py WORK OUT/NAME.tar.gz [--limit-mib 16]

Every file under WORK goes in, except inside a model folder (one holding ``model.safetensors``)
where only the weights, ``config.json`` and the tokenizer's files go (no checkpoints, no
optimizer). If the tarball is too large, the models' weights are written in bf16 (said in
``PACKING.txt``: widen them back with ``.float()``), then whole model folders are left out,
last first, until it fits. Prints one line per decision; ``PACKING.txt`` in the tarball says the
same. Exit status 0 when a tarball within the limit was written.
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from pathlib import Path

KEEP_IN_MODEL = ("model.safetensors", "config.json", "generation_config.json",
                 "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")


def model_dirs(work: Path) -> list[Path]:
    return sorted(p.parent for p in work.rglob("model.safetensors"))


def members(work: Path, models: list[Path], dropped: set[Path]) -> list[Path]:
    out = []
    for p in sorted(work.rglob("*")):
        if not p.is_file():
            continue
        home = next((m for m in models if m in p.parents), None)
        if home is not None and (home in dropped or p.name not in KEEP_IN_MODEL):
            continue
        out.append(p)
    return out


def _bf16(path: Path) -> bytes:
    import torch
    from safetensors.torch import load_file, save

    tensors = load_file(str(path))
    return save({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                 for k, v in tensors.items()}, metadata={"format": "pt", "dtype": "bf16"})


def write(work: Path, dest: Path, files: list[Path], bf16: bool, notes: list[str]) -> int:
    tmp = dest.with_name(dest.name + ".part")
    with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
        for p in files:
            arc = f"{work.name}/{p.relative_to(work)}"
            if bf16 and p.name == "model.safetensors":
                data = _bf16(p)
                info = tarfile.TarInfo(arc)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.add(p, arcname=arc)
        text = ("\n".join(notes) + "\n").encode()
        info = tarfile.TarInfo(f"{work.name}/PACKING.txt")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    tmp.replace(dest)
    return dest.stat().st_size


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--limit-mib", type=float, default=16.0)
    a = p.parse_args(argv)
    limit = int(a.limit_mib * 2**20)
    a.dest.parent.mkdir(parents=True, exist_ok=True)
    models = model_dirs(a.work)
    dropped: set[Path] = set()
    notes = [f"packed from {a.work}; {len(models)} model folder(s)"]
    bf16 = False
    size = write(a.work, a.dest, members(a.work, models, dropped), bf16, notes)
    while size > limit:
        if not bf16 and models:
            bf16 = True
            notes.append(f"{size / 2**20:.1f} MiB > {a.limit_mib:g}: weights written in bf16 "
                         "(widen with .float() before evaluating)")
        elif len(dropped) < len(models):
            last = [m for m in models if m not in dropped][-1]
            dropped.add(last)
            notes.append(f"{size / 2**20:.1f} MiB > {a.limit_mib:g}: left out the model "
                         f"{last.relative_to(a.work)}")
        else:
            notes.append(f"{size / 2**20:.1f} MiB > {a.limit_mib:g} with no model left: "
                         "the logs alone are too large")
            print("\n".join(notes))
            return 1
        print(notes[-1], flush=True)
        size = write(a.work, a.dest, members(a.work, models, dropped), bf16, notes)
    notes.append(f"tarball {a.dest.name}: {size / 2**20:.2f} MiB")
    print(notes[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
