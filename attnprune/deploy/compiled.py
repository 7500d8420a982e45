"""``attnprune.compile``: a model compiled for a few fixed input shapes (buckets).

``torch.compile`` specialises a graph on its input shapes; CUDA graphs (``mode="reduce-overhead"``)
replay one recorded graph per shape. A server sees every batch size and length, so each new
shape would compile and record again. Here each batch is padded up to the smallest bucket that
holds it (``lengths`` for the tokens, ``batch_sizes`` for the rows), the model runs at that
shape, and the outputs are cut back to the caller's: a handful of graphs serve every input.

    fast = attnprune.compile(model, lengths=(128, 256, 512), batch_sizes=(1, 8, 32))
    out = fast(input_ids=ids, attention_mask=mask)     # same outputs as model(...), cut to (B, T)

Padding is what the model already ignores: padded tokens get ``attention_mask`` 0 (the
pruning methods count real tokens only, so padding changes no keep decision), padded rows copy
the first row (a real input whose outputs are dropped). Compare a pruned model with the full
one compiled by this same function (the same buckets): the padding is then the same on both
sides. Inference only: a batch with ``labels`` is refused (the loss would count padded rows).
A batch whose tokens are padded and that gives no ``attention_mask`` gets one (1 on its own
tokens, 0 on the padding).

``backend="cudagraphs"`` captures the model itself, without torch.compile: one
``torch.cuda.CUDAGraph`` per bucket (:class:`CUDAGraphRunner`), recorded at the bucket's first
call after a warm-up on a side stream, then replayed with the inputs copied into the bucket's
static buffers and the outputs copied out. Capture takes about as long as a few forwards,
where inductor compiles for tens of seconds a shape. The forward must not read the device
back (a CUDA graph cannot record a host sync): a pruned model takes the host's sync-free path
(the default on a GPU), a fixed-ratio method; anything else is refused with the reason.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

__all__ = ["BucketedModel", "CUDAGraph", "CUDAGraphRunner", "EagerGraph", "capture_problem", "compile"]

# per-token outputs of two dimensions (B, T) that are cut in both; every (B, T, ...) output of
# three or more dimensions is cut in both too, every other output only in its rows
_TOKEN_2D = ("mask", "kept")


def _buckets(name: str, values: Sequence[int]) -> tuple[int, ...]:
    try:
        out = tuple(sorted({int(v) for v in values}))
    except (TypeError, ValueError):
        raise TypeError(f"{name}: give positive integers, got {values!r}") from None
    if not out or out[0] < 1:
        raise ValueError(f"{name}: give positive integers, got {values!r}")
    return out


class BucketedModel:
    """The callable :func:`compile` returns; ``model`` is the module it wraps (patched or not)
    and ``compiled`` the ``torch.compile`` of it (or, with ``backend="cudagraphs"``, the
    :class:`CUDAGraphRunner` that captures it: ``compiled.graphs`` holds one graph per bucket
    used)."""

    def __init__(self, model: nn.Module, compiled, lengths: tuple[int, ...],
                 batch_sizes: tuple[int, ...], pad_token_id: int, clone: bool) -> None:
        self.model = model
        self.compiled = compiled
        self.lengths = lengths
        self.batch_sizes = batch_sizes
        self.pad_token_id = pad_token_id
        self.clone = clone  # CUDA graphs reuse their output buffers: hand out copies

    def shape_for(self, batch: int, length: int) -> tuple[int, int]:
        """The bucket (rows, tokens) a batch of ``batch`` × ``length`` runs at."""
        if length > self.lengths[-1]:
            raise ValueError(f"input length {length} is above the largest of lengths="
                             f"{self.lengths}: add a larger bucket or truncate the inputs")
        rows = self.batch_sizes[min(bisect.bisect_left(self.batch_sizes, batch),
                                    len(self.batch_sizes) - 1)]
        return rows, self.lengths[bisect.bisect_left(self.lengths, length)]

    def __call__(self, input_ids: Tensor | None = None, **inputs):
        if "labels" in inputs:
            raise ValueError("labels: attnprune.compile serves inference; the loss would count "
                             "the padded rows (call the model itself to train)")
        if input_ids is not None:
            inputs["input_ids"] = input_ids
        per_token = {k: v for k, v in inputs.items() if isinstance(v, Tensor) and v.dim() == 2}
        if not per_token:
            raise ValueError("inputs: give input_ids (or inputs_embeds is not bucketed: call "
                             "the model itself)")
        shapes = {tuple(v.shape) for v in per_token.values()}
        if len(shapes) > 1:
            raise ValueError(f"inputs: every (batch, length) input must have one shape, got "
                             f"{ {k: tuple(v.shape) for k, v in per_token.items()} }")
        batch, length = shapes.pop()
        top = self.batch_sizes[-1]
        if inputs.get("attention_mask") is None and length < self.shape_for(1, length)[1]:
            # padded tokens must be masked: without a mask the model would attend to them
            first = next(iter(per_token.values()))
            per_token["attention_mask"] = inputs["attention_mask"] = torch.ones(
                batch, length, dtype=torch.long, device=first.device)
        if batch > top:  # larger batches run in chunks of the largest bucket
            parts = [self(**{k: v[i:i + top] if k in per_token else v for k, v in inputs.items()})
                     for i in range(0, batch, top)]
            return _cat(parts)
        rows, tokens = self.shape_for(batch, length)
        padded = {k: (_pad(v, rows, tokens, self._fill(k)) if k in per_token else v)
                  for k, v in inputs.items()}
        with torch.no_grad():  # inference: no autograd graph compiled or recorded around it
            out = self.compiled(**padded)
        return _cut(out, rows, tokens, batch, length, self.clone)

    def _fill(self, name: str) -> int:
        return self.pad_token_id if name == "input_ids" else 0


def _pad(x: Tensor, rows: int, tokens: int, fill: int) -> Tensor:
    """(B, T) → (rows, tokens): new tokens ``fill``, new rows copies of row 0."""
    b, t = x.shape
    if tokens > t:
        x = torch.cat([x, x.new_full((b, tokens - t), fill)], dim=1)
    if rows > b:
        x = torch.cat([x, x[:1].expand(rows - b, -1)], dim=0)
    return x


def _cut_one(name: str, t, rows: int, tokens: int, batch: int, length: int, clone: bool):
    if not isinstance(t, Tensor) or t.dim() == 0 or t.shape[0] != rows:
        return t
    t = t[:batch]
    if t.dim() >= 2 and t.shape[1] == tokens and (t.dim() >= 3 or name.endswith(_TOKEN_2D)):
        t = t[:, :length]
    return t.clone() if clone else t


def _cut(out, rows: int, tokens: int, batch: int, length: int, clone: bool):
    if isinstance(out, Tensor):
        return _cut_one("", out, rows, tokens, batch, length, clone)
    if isinstance(out, Mapping):  # ModelOutput is an OrderedDict: rebuild the same class
        return type(out)(**{k: _cut_one(k, v, rows, tokens, batch, length, clone)
                            for k, v in out.items()})
    if isinstance(out, tuple):
        return type(out)(_cut_one("", v, rows, tokens, batch, length, clone) for v in out)
    return out


def _cat(parts: list):
    first = parts[0]
    if isinstance(first, Tensor):
        return torch.cat(parts)
    if isinstance(first, Mapping):
        return type(first)(**{k: (torch.cat([p[k] for p in parts])
                                  if isinstance(v, Tensor) and v.dim() > 0 else v)
                              for k, v in first.items()})
    return type(first)(torch.cat(list(vs)) if isinstance(vs[0], Tensor) else vs[0]
                       for vs in zip(*parts, strict=True))


# ----------------------------------------------------------------------------- CUDA graphs
class CUDAGraph:
    """One ``torch.cuda.CUDAGraph``, as the runner uses it: ``capture(fn, warmup)`` calls
    ``fn`` ``warmup`` times on a side stream (as torch's CUDA-graph docs require before a
    capture: lazy initialisation, cuBLAS workspaces, the allocator's first blocks stay out of
    the graph), then records one call of it on that same stream and returns what that call
    returned (the graph's static outputs: tensors the replays write); ``replay()`` runs the
    recorded kernels again on the current stream. ``pool``: a memory pool shared with the other
    graphs of one runner; ``stream``: the side stream (the same for every capture into one
    pool, as ``torch.cuda.graph`` asks)."""

    def __init__(self, pool=None, stream=None) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool
        self.stream = stream

    def capture(self, fn: Callable[[], object], warmup: int):
        stream = self.stream if self.stream is not None else torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(self.graph, pool=self.pool, stream=stream):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()

    def reset(self) -> None:
        self.graph.reset()


class EagerGraph:
    """A stand-in for :class:`CUDAGraph` where there is no CUDA (the CPU tests, the bench's
    dry run): ``capture`` runs ``fn`` (``warmup`` times, then once more) and keeps what the last
    call returned as the static outputs; ``replay`` runs ``fn`` again on the static inputs and
    writes its results into those same output tensors, as a graph's replay does. So everything
    around the graph (buffers, copies in and out, one graph per shape) runs as on a GPU, and an
    output whose shape changes between calls (a data-dependent path) fails here as it would
    fail to be captured there."""

    def __init__(self) -> None:
        self.fn: Callable[[], object] | None = None
        self.outputs = None

    def capture(self, fn: Callable[[], object], warmup: int):
        with torch.inference_mode():  # like a graph's, its outputs are written in place
            for _ in range(warmup):
                fn()
            self.fn, self.outputs = fn, fn()
        return self.outputs

    def replay(self) -> None:
        with torch.inference_mode():
            _copy_into(self.outputs, self.fn())

    def reset(self) -> None:
        self.fn = self.outputs = None


def _copy_into(dest, src) -> None:
    """Write the tensors of ``src`` into those of ``dest`` (the same structure)."""
    if isinstance(dest, Tensor):
        if not isinstance(src, Tensor) or src.shape != dest.shape:
            got = tuple(src.shape) if isinstance(src, Tensor) else type(src).__name__
            raise RuntimeError(
                f"the forward's outputs changed shape between calls on inputs of one shape "
                f"({tuple(dest.shape)} then {got}): its shapes depend on the data, which a CUDA "
                f"graph cannot replay; a pruned model must take the sync-free path "
                f"(patch(..., sync_free=True), a fixed-ratio method)")
        dest.copy_(src)
    elif isinstance(dest, Mapping):
        for k, v in dest.items():
            _copy_into(v, src[k])
    elif isinstance(dest, (tuple, list)):
        for d, t in zip(dest, src, strict=True):
            _copy_into(d, t)


def _clone_out(out):
    """The outputs with every tensor copied (the caller's own, safe from the next replay)."""
    if isinstance(out, Tensor):
        return out.clone()
    if isinstance(out, Mapping):  # ModelOutput is an OrderedDict: rebuild the same class
        return type(out)(**{k: _clone_out(v) for k, v in out.items()})
    if isinstance(out, tuple):
        return type(out)(_clone_out(v) for v in out)
    if isinstance(out, list):
        return [_clone_out(v) for v in out]
    return out


def capture_problem(model: nn.Module) -> str | None:
    """Why ``model``'s forward cannot be captured in a CUDA graph, told from its patch before
    any capture (None: no known reason). A graph records kernels only; a forward that reads a
    count back from the device (a host sync) cannot be recorded: a patch with
    ``sync_free=False``, or a method that decides its kept count from the data
    (``variable_budget``: LTP, entropy_threshold, DTR, hybrid read their largest count back once
    per pruning layer)."""
    from attnprune.api import patch_state

    state = patch_state(model)
    states = [] if state is None else list(getattr(state, "states", [state]))
    for s in states:
        if getattr(s, "sync_free", None) is False:
            return (f"model: patched ({s.method!r}) with sync_free=False, whose forward reads "
                    f"kept counts back from the device, which a CUDA graph cannot record; "
                    f"patch with sync_free=None (sync-free on a GPU) or True")
        if getattr(getattr(s, "modules", None), "variable_budget", False):
            return (f"model: method {s.method!r} decides its kept count from the data "
                    f"(variable_budget) and reads it back from the device once per pruning "
                    f"layer, which a CUDA graph cannot record; use a fixed-ratio method "
                    f"(attention_mass, entropy, tome, ...) or call the model itself")
    return None


_VALUES = (type(None), bool, int, float, str)


def _signature(inputs: Mapping) -> tuple:
    """What one graph is specialised on: each tensor's name, shape, dtype and device, and the
    value of every other keyword (a flag such as ``return_dict``)."""
    parts = []
    for k in sorted(inputs):
        v = inputs[k]
        if isinstance(v, Tensor):
            parts.append((k, tuple(v.shape), v.dtype, v.device))
        elif isinstance(v, _VALUES):
            parts.append((k, None, type(v).__name__, v))
        else:
            raise TypeError(f"{k}: a captured forward takes tensors and plain values (None, "
                            f"bool, int, float, str), got {type(v).__name__}")
    return tuple(parts)


class _Static:
    """One captured graph: its static input buffers, its graph and its static outputs."""

    def __init__(self, graph, inputs: dict[str, Tensor], values: dict, outputs) -> None:
        self.graph = graph
        self.inputs = inputs
        self.values = values
        self.outputs = outputs


class CUDAGraphRunner:
    """``model`` run as CUDA graphs: a callable taking the model's keyword inputs.

    The first call with a new signature (each tensor's shape, dtype and device, the other
    keywords' values) makes static input buffers (copies of the inputs), warms the model up
    and captures one forward on them (``graph``: a factory of graph objects, default
    :class:`CUDAGraph`; :class:`EagerGraph` without CUDA). Every call then copies its inputs
    into that signature's buffers, replays the graph and returns its outputs, cloned when
    ``clone`` (default) so that a later replay never overwrites what a caller holds; with
    ``clone=False`` they are the graph's own buffers, valid until this runner's next call.
    ``graphs``: the captured graphs by signature. Calls are serialised by a lock (the buffers
    are shared), and each call's work waits on the previous one's on the device, from any
    stream. The graphs of one runner share one memory pool and one capture stream.

    Inference only (run under ``torch.no_grad``). A patched model's per-call statistics on its
    patch state (``stats``, ``kept_mask``) are those of the capture: replays run no Python;
    read the kept mask from the output (``output.kept_mask``). A model that cannot be captured
    (:func:`capture_problem`) is refused here; a capture that fails on a host sync raises a
    RuntimeError naming the cause."""

    def __init__(self, model: nn.Module, *, warmup: int = 3, clone: bool = True,
                 graph: Callable[[], object] | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup: calls before each capture, an integer ≥ 1, got {warmup!r}")
        problem = capture_problem(model)
        if problem is not None:
            raise ValueError(problem)
        self.model = model
        self.warmup = warmup
        self.clone = bool(clone)
        self.graph = graph
        self.graphs: dict[tuple, _Static] = {}
        self._lock = threading.Lock()
        self._device: torch.device | None = None  # the first capture's
        self._pool = self._stream = self._done = None  # CUDA: made at the first capture

    def __call__(self, **inputs):
        key = _signature(inputs)
        with self._lock, torch.no_grad():
            static = self.graphs.get(key)
            if static is None:
                static = self.graphs[key] = self._capture(inputs)
            if self._done is None:
                return self._run(static, inputs)
            with torch.cuda.device(self._device):
                stream = torch.cuda.current_stream()
                stream.wait_event(self._done)  # the previous call's work, from any stream
                out = self._run(static, inputs)
                self._done.record(stream)
                return out

    def _run(self, static: _Static, inputs: Mapping):
        for k, buf in static.inputs.items():
            buf.copy_(inputs[k])
        static.graph.replay()
        return _clone_out(static.outputs) if self.clone else static.outputs

    def _capture(self, inputs: Mapping) -> _Static:
        tensors = {k: v for k, v in inputs.items() if isinstance(v, Tensor)}
        if not tensors:
            raise ValueError("inputs: a captured forward needs at least one tensor input")
        devices = {v.device for v in tensors.values()}
        if len(devices) > 1:
            raise ValueError(f"inputs: every tensor on one device, got {sorted(map(str, devices))}")
        device = devices.pop()
        if self._device is not None and device != self._device:
            raise ValueError(f"inputs: this runner's graphs are on {self._device}, got inputs "
                             f"on {device}")
        if self.graph is None:
            if device.type != "cuda":
                raise ValueError(f"inputs: CUDA graphs record work on a CUDA device; the inputs "
                                 f"are on {device} (move the model and inputs to cuda)")
            with torch.cuda.device(device):
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                    self._stream = torch.cuda.Stream()
                    self._done = torch.cuda.Event()
                graph = CUDAGraph(self._pool, self._stream)
        else:
            graph = self.graph()
        self._device = device
        # the buffers are plain tensors even under inference_mode: later calls copy into them
        with torch.inference_mode(False):
            buffers = {k: torch.empty_like(v).copy_(v) for k, v in tensors.items()}
        values = {k: v for k, v in inputs.items() if k not in tensors}

        def forward():
            return self.model(**buffers, **values)

        try:
            if device.type == "cuda":
                with torch.cuda.device(device):
                    outputs = graph.capture(forward, self.warmup)
            else:
                outputs = graph.capture(forward, self.warmup)
        except RuntimeError as e:
            if "captur" not in str(e).lower():
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RuntimeError(
                f"CUDA graph capture of {type(self.model).__name__} failed ({first}): its "
                f"forward reads the device back or copies from the host (.item(), .tolist(), "
                f"bool(tensor), a data-dependent shape, a CPU tensor moved to the GPU), which a "
                f"graph cannot record. A pruned model must take the sync-free path: a "
                f"fixed-ratio method, patched with sync_free=None or True") from e
        return _Static(graph, buffers, values, outputs)

    def reset(self) -> None:
        """Drop every captured graph (and, on CUDA, free its memory with the pool's last one)."""
        with self._lock:
            for static in self.graphs.values():
                reset = getattr(static.graph, "reset", None)
                if reset is not None:
                    reset()
            self.graphs.clear()


def compile(model: nn.Module, lengths: Sequence[int] = (128, 256, 512),
            batch_sizes: Sequence[int] = (1, 8, 32, 128), pad_token_id: int | None = None,
            **compile_options) -> BucketedModel:
    """``model`` (patched or not) compiled for the buckets ``lengths`` × ``batch_sizes``.

    ``compile_options`` go to ``torch.compile``; the defaults are ``fullgraph=True`` (a graph
    break would fall back to Python between kernels), ``dynamic=False`` (one graph per bucket,
    as CUDA graphs need) and ``mode="reduce-overhead"`` (CUDA graphs) for a model on a CUDA
    device, torch's default mode elsewhere. ``pad_token_id``: the id padded tokens get (default:
    the model config's, else 0; the attention mask hides them either way).

    ``backend="cudagraphs"``: no torch.compile (and not its backend of that name): the model
    itself is captured, one CUDA graph per bucket (:class:`CUDAGraphRunner`, outputs cloned out),
    after ``warmup`` calls (default 3) on a side stream; the only other option it takes. The
    model must sit on a CUDA device and be capturable (:func:`capture_problem`)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    lengths = _buckets("lengths", lengths)
    batch_sizes = _buckets("batch_sizes", batch_sizes)
    if pad_token_id is None:
        pad_token_id = getattr(getattr(model, "config", None), "pad_token_id", None) or 0
    param = next(model.parameters(), None)
    on_cuda = param is not None and param.device.type == "cuda"
    if compile_options.get("backend") == "cudagraphs":
        other = sorted(set(compile_options) - {"backend", "warmup"})
        if other:
            raise ValueError(f"{', '.join(other)}: torch.compile options; backend='cudagraphs' "
                             f"captures the model without torch.compile and takes only warmup")
        if not on_cuda:
            where = "no parameters" if param is None else f"its parameters on {param.device}"
            raise ValueError(f"backend='cudagraphs': CUDA graphs record work on a CUDA device; "
                             f"the model has {where} (move it with .to('cuda'), or leave "
                             f"backend out for torch.compile)")
        runner = CUDAGraphRunner(model, warmup=compile_options.get("warmup", 3))
        return BucketedModel(model, runner, lengths, batch_sizes, int(pad_token_id), clone=False)
    if "warmup" in compile_options:
        raise ValueError("warmup: an option of backend='cudagraphs' only")
    options = {"fullgraph": True, "dynamic": False}
    if on_cuda and "backend" not in compile_options:
        options["mode"] = "reduce-overhead"
    options.update(compile_options)
    graphs = options.get("mode") in ("reduce-overhead", "max-autotune")
    from attnprune.compat import fix_transformers_exporting

    fix_transformers_exporting()  # torch 2.11: no expanded mask for unpadded rows (issue 46)
    return BucketedModel(model, torch.compile(model, **options), lengths, batch_sizes,
                         int(pad_token_id), clone=on_cuda and graphs)
