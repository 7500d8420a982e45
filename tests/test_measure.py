"""measure.py: FLOPs against REFERENCE_VALUES.md, the timing function's contract."""

import pytest
import torch
import torch.nn.functional as F

from attnprune.measure import count_flops, env_info, time_fn


def test_sdpa_flops_cpu_gap_filled():
    q = torch.randn(2, 4, 128, 32)
    assert count_flops(F.scaled_dot_product_attention, q, q, q) == 16_777_216


def test_multihead_attention_fastpath_off():
    m = torch.nn.MultiheadAttention(128, 4, batch_first=True).eval()
    x = torch.randn(2, 128, 128)
    with torch.no_grad():
        assert count_flops(m, x, x, x) == 50_331_648


def test_sdpa_forward_backward():
    q = torch.randn(2, 4, 128, 32, requires_grad=True)
    assert count_flops(lambda: F.scaled_dot_product_attention(q, q, q).sum().backward()) == 58_720_256


def test_by_module_and_linear():
    lin = torch.nn.Linear(8, 4)
    total, per = count_flops(lin, torch.randn(3, 8), by_module=True)
    assert total == 2 * 3 * 8 * 4 and per["Global"] == total


def test_time_fn_contract():
    calls = []
    t = time_fn(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 7 and t.repeats == 5 and len(t.times_s) == 5
    assert t.median_s >= 0 and t.mad_s >= 0 and t.threads == torch.get_num_threads()
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: None, repeats=0)
    assert set(env_info()) == {"torch", "transformers", "threads", "device", "python"}


def test_peak_memory_sees_a_large_tensor_each_time():
    from attnprune.measure import peak_memory

    def big():
        x = torch.ones(25_000_000)  # 100 MB
        return float(x.sum())

    for _ in range(2):  # works repeatedly in one process (ru_maxrss would not)
        assert peak_memory(big) > 60_000_000
    assert peak_memory(lambda: None) < 30_000_000


def test_peak_memory_leaves_a_callers_tracemalloc_running():
    """A caller tracing with tracemalloc keeps tracing (before, peak_memory stopped it), and
    the Python peak is read from where the caller's trace stood: 40 MB the caller already
    holds do not count."""
    import tracemalloc

    from attnprune.measure import peak_memory

    tracemalloc.start()
    try:
        held = b"x" * 40_000_000
        assert peak_memory(lambda: None) < 30_000_000
        assert tracemalloc.is_tracing()
        assert peak_memory(lambda: len(b"y" * 50_000_000)) > 45_000_000
        assert tracemalloc.is_tracing() and len(held) == 40_000_000
    finally:
        tracemalloc.stop()
    peak_memory(lambda: None)
    assert not tracemalloc.is_tracing()  # its own tracing ends with the call


def test_time_interleaved_rotates_and_times_every_callable():
    from attnprune.measure import time_interleaved

    calls = []
    fns = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    out = time_interleaved(fns, repeats=3, warmup=1)
    assert set(out) == {"a", "b", "c"}
    assert all(t.repeats == 3 and len(t.times_s) == 3 for t in out.values())
    assert calls[:3] == ["a", "b", "c"]  # warm-ups
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # order rotates
    with pytest.raises(ValueError, match="repeats"):
        time_interleaved(fns, repeats=0)


def test_time_interleaved_ranks_a_slow_callable_slower():
    import time as _time

    from attnprune.measure import time_interleaved

    out = time_interleaved({"fast": lambda: None, "slow": lambda: _time.sleep(0.005)},
                           repeats=5, warmup=0)
    assert out["slow"].median_s > out["fast"].median_s + 0.004


def test_timers_synchronise_an_accelerator(monkeypatch):
    """On CUDA a timer must wait for the queued kernels. Mock device: launching returns at
    once and the work (20 ms) is done when torch.cuda.synchronize() is called; a timer that
    does not synchronise measures the launch (~0 ms) and fails here."""
    import time

    from attnprune import measure

    pending = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Mock GPU")

    def sync(*a):
        while pending:
            time.sleep(pending.pop())

    monkeypatch.setattr(torch.cuda, "synchronize", sync)

    def launch():  # an asynchronous kernel launch: returns before the work is done
        pending.append(0.02)

    t = measure.time_fn(launch, repeats=3, warmup=1)
    assert t.median_s >= 0.018 and t.device == "cuda (Mock GPU)"
    both = measure.time_interleaved({"a": launch, "b": launch}, repeats=3, warmup=1)
    assert min(x.median_s for x in both.values()) >= 0.018
    env = measure.env_info(dtype=torch.bfloat16)
    assert env["device"] == "cuda" and env["gpu"] == "Mock GPU" and env["dtype"] == "bfloat16"


def test_cuda_events_time_the_gpu_clock(monkeypatch):
    """``cuda_events=True`` on CUDA reads the time between two events recorded around the call
    (mock events: 7 ms apart on the "GPU", whatever the host clock says), and says so; without
    CUDA it times by the clock."""
    from attnprune import measure

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Mock GPU")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    recorded = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self, stream=None):
            recorded.append(self)

        def elapsed_time(self, end):
            return 7.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    out = measure.time_interleaved({"a": lambda: None, "b": lambda: None}, repeats=3, warmup=1,
                                   cuda_events=True)
    assert all(t.median_s == 0.007 for t in out.values()) and len(recorded) == 12
    assert out["a"].device == "cuda (Mock GPU), CUDA events"
    plain = measure.time_interleaved({"a": lambda: None}, repeats=2, warmup=0)
    assert plain["a"].median_s < 0.007 and plain["a"].device == "cuda (Mock GPU)"


def test_cpu_timing_records_the_cpu():
    from attnprune import measure

    assert measure.time_fn(lambda: None, repeats=2, warmup=0).device == "cpu"
    assert measure.env_info()["device"] == "cpu"


def test_the_library_leaves_malloc_alone():
    """No library module changes the C allocator for the process (``mallopt``): the benchmarks'
    fixed mmap threshold lives in attnprune/bench/_memory.py and runs in a child process."""
    from pathlib import Path

    import attnprune

    root = Path(attnprune.__file__).parent
    library = [p for p in root.rglob("*.py")
               if p.relative_to(root).parts[0] not in ("bench", "research", "runs", "train")]
    assert len(library) > 20
    assert [str(p.relative_to(root)) for p in library if "mallopt" in p.read_text()] == []
    from attnprune import measure

    assert not hasattr(measure, "return_freed_memory")


def test_effective_flops_of_a_tiny_gpt2_by_hand():
    """Σ_l FLOPs_l · kept_l on a 2-block GPT-2 (d = 8, V = 16, T = 4), counted by hand: a block
    is 24·T·d² (the linears) + 4·T²·d (QKᵀ and AV, the counter does not halve causal) = 6656,
    the head 2·T·d·V = 1024; keeping all of block 0 and half of block 1 leaves
    1024 + 6656 + 3328 = 11008."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnprune.measure import effective_flops

    cfg = GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=16, n_positions=8,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    total, per = count_flops(model, torch.randint(0, 16, (1, 4)), by_module=True)
    per_layer = [per[f"GPT2LMHeadModel.transformer.h.{l}"] for l in range(2)]
    assert (total, per_layer) == (14336, [6656, 6656])
    assert effective_flops(per_layer, [1.0, 0.5], total=total) == 11008
    assert effective_flops(per_layer, [1.0, 0.5]) == 6656 + 3328  # the layers alone
    with pytest.raises(ValueError, match="kept_ratio"):
        effective_flops(per_layer, [1.0])


def test_effective_flops_with_cuts_in_the_middle_by_hand():
    """Several cuts, the first in the middle (issue 48: the one case above has its cut at the
    last block, so using the kept ratio only at the first reduced layer passed). A 4-block
    GPT-2 (d = 8, V = 16, T = 4): each block 6656 FLOPs, the head 1024, total 27648. Keeping
    all of block 0, 3/4 of block 1, then half of blocks 2 and 3 (cuts after blocks 0 and 1):
    6656 · (1 + 0.75 + 0.5 + 0.5) = 18304 for the layers, + 1024 = 19328; a single cut in the
    middle (half from block 2 on): 6656 · 3 + 1024 = 20992."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnprune.measure import effective_flops

    cfg = GPT2Config(n_layer=4, n_embd=8, n_head=2, vocab_size=16, n_positions=8,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    total, per = count_flops(model, torch.randint(0, 16, (1, 4)), by_module=True)
    per_layer = [per[f"GPT2LMHeadModel.transformer.h.{l}"] for l in range(4)]
    assert (total, per_layer) == (27648, [6656] * 4)
    assert effective_flops(per_layer, [1.0, 0.75, 0.5, 0.5]) == 18304
    assert effective_flops(per_layer, [1.0, 0.75, 0.5, 0.5], total=total) == 19328
    assert effective_flops(per_layer, [1.0, 1.0, 0.5, 0.5], total=total) == 20992
    assert effective_flops(per_layer, [0.5, 0.5, 0.5, 0.5], total=total) == 1024 + 2 * 6656
