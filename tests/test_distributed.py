"""Several processes (``torchrun``, gloo on CPU): one results folder written by process 0,
every test row scored once, and training that matches one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_finetune import one_thread, tiny  # noqa: F401 (fixtures: a 3-layer BERT, a 3-class CSV)

from attnprune.research.finetune import FinetuneConfig, main
from attnprune.runs import distributed
from attnprune.runs.results import ResultsDir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def no_dropout(tiny):  # noqa: F811 (the imported fixture)
    """The tiny model without dropout: each process draws its own dropout masks, so only a
    dropout-free model can be compared number for number with a one-process run."""
    src, dst = tiny / "model", tiny / "model_no_dropout"
    dst.mkdir(exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def common(tiny, model, batch_size):  # noqa: F811
    # 72 train rows → --max-train 32: 4 batches of 8 (2 per process), 2 of 16 in one process;
    # 9 test rows in batches of 2: 5 batches, 3 on process 0 and 2 on process 1 (uneven)
    return ["--model", str(model), "--data", f"csv:{tiny / 'data.csv'}", "--epochs", "2",
            "--lr", "1e-3", "--batch-size", str(batch_size), "--eval-batch-size", "2",
            "--max-train", "32", "--timing-batches", "1", "--timing-repeats", "1",
            "--progress", "false", "--threads", "1"]


def torchrun(*args, timeout=600):  # a safety net against a hang; ~20 s unloaded
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", "-m", "attnprune", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)  # the return code is what the tests check


@pytest.mark.slow
def test_torchrun_finetune_one_folder_every_row_once(tiny, no_dropout, tmp_path, one_thread):  # noqa: F811
    from safetensors.torch import load_file

    from attnprune.research.data.text import load_text_data

    out = tmp_path / "ddp"
    p = torchrun("finetune", *common(tiny, no_dropout, 8), "--out", str(out))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]  # 0 only if both ranks exit 0
    folders = list(out.iterdir())
    assert len(folders) == 1, folders  # one folder, its timestamped name agreed by both ranks
    run = folders[0]
    # printed once (process 0), and no temp file left by two processes writing one file
    assert p.stdout.count("results: ") == 1 and p.stdout.count("accuracy ") == 1, p.stdout
    assert not [f for f in run.rglob("*") if f.name.endswith(".tmp")]
    assert sorted(f.name for f in (run / "predictions").iterdir()) == ["full__seed0.npz"]
    assert (run / "models" / "full__seed0" / "model.safetensors").is_file()

    test = load_text_data(f"csv:{tiny / 'data.csv'}", "text", "label").test
    pred = np.load(run / "predictions" / "full__seed0.npz")
    np.testing.assert_array_equal(pred["y_true"], test.labels)  # every row once, in order
    s = json.loads((run / "summary.json").read_text())
    assert s["methods"]["full"]["n_seeds"] == 1
    record = json.loads((run / "runs" / "full__seed0.json").read_text())
    assert record["test"]["n"] == len(test)

    # DDP really trains: two processes with batches of 8 = one process with batches of 16
    # (same rows per step, gradients averaged), up to float rounding
    one = tmp_path / "one"
    assert main([*common(tiny, no_dropout, 16), "--out", str(one), "--exact-out"]) == 0
    w2, w1 = (load_file(str(d / "models" / "full__seed0" / "model.safetensors")) for d in (run, one))
    w0 = load_file(str(no_dropout / "model.safetensors"))
    assert max(float((w2[k] - w0[k]).abs().max()) for k in w0 if k in w2) > 1e-4  # it moved
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=1e-5, rtol=1e-4)
    ref = np.load(one / "predictions" / "full__seed0.npz")
    np.testing.assert_allclose(pred["scores"], ref["scores"], atol=1e-5)
    one_record = json.loads((one / "runs" / "full__seed0.json").read_text())
    for h2, h1 in zip(record["history"], one_record["history"], strict=True):
        assert h2["train_task"] == pytest.approx(h1["train_task"], abs=1e-5)  # mean of both ranks
        assert h2["val_accuracy"] == h1["val_accuracy"] and h2["val_n"] == h1["val_n"]
    assert record["test"]["flops"]["measured"] == one_record["test"]["flops"]["measured"]
    assert record["test"]["time"]["median_s"] > 0  # timed, by process 0


@pytest.mark.slow
def test_torchrun_config_error_stops_every_rank(tiny, tmp_path):  # noqa: F811
    """A bad option, found by process 0, ends both processes (no rank left waiting)."""
    p = torchrun("finetune", *common(tiny, tiny / "model", 8), "--keep-ratio", "1.5",
                 "--out", str(tmp_path / "bad"), timeout=300)
    assert p.returncode != 0
    assert p.stderr.count("--keep-ratio: must be in") >= 2  # reported by both ranks, as typed
    assert not (tmp_path / "bad").exists()


def test_one_process_is_a_no_op(tmp_path, monkeypatch):
    """Without a launcher nothing touches torch.distributed: rank 0 of 1, writes go through."""
    for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert not distributed.launched() and distributed.world_size() == 1 and distributed.is_main()
    assert distributed.gather({"a": 1}) == [{"a": 1}] and distributed.broadcast(3) == 3
    res = distributed.start_results(tmp_path, "finetune", False, FinetuneConfig())
    assert type(res) is ResultsDir and res.writer and (res.path / "config.yaml").is_file()
    with pytest.raises(ZeroDivisionError):
        distributed.on_main(lambda: 1 / 0)


def test_shard_batches_one_process_keeps_the_loader(monkeypatch):
    from torch.utils.data import DataLoader

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    loader = DataLoader(list(range(10, 17)), batch_size=3, collate_fn=torch.tensor)
    got = list(distributed.shard_batches(loader))
    assert [pos for pos, _ in got] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [b.tolist() for _, b in got] == [b.tolist() for b in loader]
    with pytest.raises(ValueError, match="loader"):
        list(distributed.shard_batches(DataLoader(list(range(4)), batch_size=None)))


def test_non_writer_writes_nothing(tmp_path):
    """What the other processes hold: a ResultsDir whose writers leave the disk alone."""
    import matplotlib.pyplot as plt

    res = ResultsDir(tmp_path / "r", writer=False)
    res.write_json("summary.json", {"a": 1})
    res.save_predictions("full", 0, [0, 1], [0, 1])
    res.save_run("full__seed0", {})
    res.write_csv("metrics.csv", [{"a": 1}])
    res.write_npy("x.npy", np.zeros(2))
    res.save_figure("f.png", plt.figure())
    assert not (tmp_path / "r").exists()
    assert not res.run_done("full__seed0") and not res.exists("summary.json")


def test_pareto_refuses_several_processes(tmp_path, monkeypatch):
    """pareto is a one-process command: under a launcher it stops before writing anything."""
    from attnprune.research.pareto import main as pareto_main
    from attnprune.runs.config import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets; no process group is needed
    with pytest.raises(ConfigError, match="one process"):
        pareto_main(["--out", str(tmp_path / "p")])
    assert not (tmp_path / "p").exists()


def test_aux_loss_reaches_the_loss_through_ddp():
    """Under DDP the model the loop holds is a wrapper: the method's auxiliary loss (here the
    entropy head's) must still be found and trained (a one-process group is enough)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from transformers import BertConfig, BertForSequenceClassification

    from attnprune import api
    from attnprune.train.loop import _loss

    model = BertForSequenceClassification(BertConfig(
        vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, num_labels=2))
    api.patch(model, "entropy", keep_ratio=0.5, after_layer=1)
    batch = {"input_ids": torch.randint(5, 30, (4, 10)),
             "attention_mask": torch.ones(4, 10, dtype=torch.long), "labels": torch.tensor([0, 1, 0, 1])}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        loss, logs = _loss(DistributedDataParallel(model), batch, None, 0.0, 1.0)
        loss.backward()
    finally:
        dist.destroy_process_group()
    assert logs.get("aux", 0) > 0
    head = [p for n, p in model.named_parameters() if n.startswith("attnprune_method.")]
    assert head and all(p.grad is not None for p in head)


def _ltp_model():
    """A tiny dropout-free BERT patched with LTP (same weights in every process: seeded)."""
    from transformers import BertConfig, BertForSequenceClassification

    from attnprune import api

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=30, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, num_labels=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        initializer_range=0.5))  # large weights: peaked attention, importances far apart
    return api.patch(model, "ltp", keep_ratio=0.5, after_layer=1)


def _ltp_batch(rank: int) -> dict:
    """Rank ``rank``'s batch: its own tokens and lengths (so its own quantiles)."""
    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(5, 30, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1:, 12 - 3 * (rank + 1):] = 0  # padding: 3 on rank 0, 6 on rank 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 0, 1])}


def _ltp_rank(rank: int, world: int, init_file: str, out: str) -> None:
    """One process of the gloo group: one training forward (LTP calibrates θ), θ saved."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        model = _ltp_model().train()
        model(**_ltp_batch(rank))
        torch.save(model.attnprune_method.theta.detach().clone(), f"{out}/theta{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ltp_calibration_agrees_across_ranks(tmp_path):
    """DDP (2 gloo processes, each its own batch): LTP's calibrated θ is one θ on every rank,
    the one a single process calibrates on both batches together (as DDP's gradients are)."""
    import torch.multiprocessing as mp

    init = tmp_path / "store"
    mp.start_processes(_ltp_rank, args=(2, str(init), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    t0, t1 = (torch.load(tmp_path / f"theta{r}.pt", weights_only=True) for r in (0, 1))
    model = _ltp_model().train()
    assert not torch.equal(t0, model.attnprune_method.theta.detach())  # it was calibrated
    torch.testing.assert_close(t0, t1, rtol=0, atol=0)
    b0, b1 = _ltp_batch(0), _ltp_batch(1)
    model(**{k: torch.cat([b0[k], b1[k]]) for k in b0})
    torch.testing.assert_close(t0, model.attnprune_method.theta.detach())
