"""Token pruning inside stock Hugging Face encoders: BERT (and MiniLM), RoBERTa, DistilBERT,
XLM-R, CamemBERT, ELECTRA, ALBERT, MPNet, DeBERTa-v2/v3, ModernBERT (what differs between
them: ``hf_attention.FAMILIES`` and the anatomies of ``hf_encoder_families``; the table of
what is tested: ``docs/families.md``).

The host wraps only the encoder loop (``BertEncoder.forward`` / ``Transformer.forward``): the
stock layers, embeddings, pooler and heads run unchanged. After the layers named by the
schedule, a registered token method scores the tokens and the host removes the dropped ones
from the tensor (gather) before the next layer:

    X⁽⁰⁾ = embeddings                                           (B, L, d)
    X⁽ˡ⁾ = layer_l(X⁽ˡ⁻¹⁾, mask⁽ˡ⁻¹⁾)                            (B, K_l, d)
    after layer l with r_l < r_{l−1}:  keep = method(X⁽ˡ⁾, A⁽ˡ⁾, ρ_l = r_l / r_{l−1})
    X⁽ˡ⁾ ← gather(X⁽ˡ⁾, keep)                                   (B, K_{l+1}, d)

Notation: B batch, L length, d width, H heads, r_l the cumulative keep ratio after layer l
(share of the original real tokens, :func:`parse_schedule`), ρ keep ratio, A⁽ˡ⁾ the attention
probabilities of layer l, m̃ a relaxed (soft) keep mask.

Choices, and why:
* Variable kept counts per example are padded to the batch maximum with a mask
  (``selection.gather_tokens``) rather than packed: the stock HF layers and SDPA take a padded
  (B, K, d) batch and a key mask; packing would need varlen kernels that CPU SDPA lacks. The
  cost is K_max − K_b padded slots per row, reported in ``stats["padded_per_layer"]``.
* Row bucketing (inference, ``bucket_rows=True``): variable-budget methods (LTP, entropy
  thresholds) leave rows with very different K_b, and padding every row to K_max wastes
  K_max − K_b slots per row in every later layer. After a gather the b rows are split into
  groups of similar K_b (:func:`attnprune.selection.row_groups`: dynamic programming over the
  sorted counts, minimising padded slots plus c = :func:`group_overhead_tokens` slots per group
  and layer, 24 per torch thread); each group, cut to its own longest row, runs the remaining layers (a later pruning
  layer may split it again: :func:`_layers` and :func:`_grouped` recurse), and the groups'
  outputs go back to their rows. Padding never attends nor is attended, so the outputs equal
  the one-batch forward up to float rounding. Equal counts (top-k on equal-length rows) give
  one group: the same path as without bucketing. Training keeps one padded batch (soft masks
  and batch losses see the whole batch).
* CLS (position 0) is always kept (``protect_first``); the gather keeps ascending order, so it
  stays at position 0 and every stock head (pooler, ``hidden[:, 0]``) reads it unchanged.
  Every separator ([SEP], ``</s>``) is kept like CLS (``protect_special``: the last real token,
  the end of each ``token_type_ids`` segment, and the ids in ``protect_token_ids``): a sentence
  pair keeps the boundary between its texts. Segment ids need no carrying through the gather:
  BERT adds their embedding before the first layer, so a kept token's state already holds it.
* The output is scattered back to (B, L, d) (``output="scatter"``; dropped tokens carry their
  last computed state) so the model's output shape is the stock one; ``output="short"`` returns
  the gathered (B, K, d) batch and skips that copy (with row groups: the same shape, K the
  longest final row; slots past a group's own width, padding either way, are zeros). The
  default ``output="auto"`` is "short" for BERT / RoBERTa / DistilBERT
  ``*ForSequenceClassification`` (their heads read only position 0, where CLS stays, and
  return no per-token states: same logits, bit for bit) and "scatter" for any other model.
  Either way the kept mask (B, L) of the call (``state.kept_mask`` per thread, and
  ``output.kept_mask``) marks the positions the last layer computed, built from the kept
  indices by one scatter: a client that pools the scattered states must average those only
  (sentence-transformers: :mod:`attnprune.deploy.sentence_transformers`).
* Attention probabilities for methods that need them are computed only at pruning layers, from
  the query/key projections the layer already computed (captured by forward hooks on the
  ``query``/``key`` linears, so nothing is recomputed), and only for the rows the method reads:
  the CLS row (B, H, 1, L) for methods with ``attention_rows == "first"``, the per-head
  attention received averaged over real queries (B, H, 1, L) for ``"received"`` (computed in
  batch chunks, never the whole (B, H, L, L) at once), all rows otherwise.
  The model keeps its own attention implementation (SDPA) for every layer.
* Training: a method that returns ``Selection.soft`` (LTP, Gumbel gates) does not gather; its
  mask enters the following layers as an additive log-mask bias on the keys,
  log m̃_j (``soft_mode="bias"``, default: at m̃_j = 0 this equals removing key j, so the
  relaxation matches the hard path), or multiplies the hidden states (``soft_mode="multiply"``).
  Masks of successive layers multiply. Methods without a soft mask gather in training too.
  In eval, every method is hard and gathers.
* One row without padding (batch-1 serving; the model gave no attention mask) stays without
  padding after every gather, so the loop takes a short path: counts from the width, the kept
  positions by one ``index_select``, and no attention mask for later layers (the stock
  no-padding SDPA call) instead of ``create_bidirectional_mask`` at each pruning layer.
* Traced (``torch.export`` / ``torch.onnx.export`` / ``torch.compile``, :func:`_tracing`):
  each gather is as wide as the batch's largest kept count, read as a data-dependent size
  (:func:`_traced_width`, an unbacked SymInt), so an exported graph keeps exactly the tokens
  the eager forward keeps, protected ones included, for top-k and threshold methods alike.
  Statistics and row bucketing, which read counts back into Python, are skipped.
* ``position_ids`` given to the model are not passed to layers after a gather (HF_NOTES.md:
  non-consecutive ids look like packed sequences); absolute positions were added at the
  embeddings already.

Measured defaults (``scripts/bench_defaults.py``: MiniLM-L6, tweets of median 33 / p90 48
tokens, max_length 64, 2 threads, attention_mass ρ = 0.5 after layer 2, pruned vs full
interleaved in one process; wall / FLOPs ratios):
    batch 32, file order:   before FLOPs 0.530 wall 0.679   after FLOPs 0.549 wall 0.611
    batch 32, length-sorted: before FLOPs 0.636 wall 0.752   after FLOPs 0.653 wall 0.720
    batch 1:                 before FLOPs 0.660 wall 0.94–0.95  after FLOPs 0.660 wall 0.97–1.00
                             (patch's own work 1.1–1.4 ms → 0.83–0.88 ms per forward; the
                             full forward is 11–14 ms: the batch-1 ratios are within noise)
Where the wall time went (batch 32, file order, before): the 4 layers after the gather ran as
5.3 row groups on average (c = 12 slots, fitted at 1 thread); at 2 threads a layer call costs
≈ 0.85–1.2 ms fixed + 21.6 µs per slot, so each group cost ≈ 40–56 slots, not 12 — the
bucketing cost more than the padding it saved (0.72 wall vs 0.68 with no bucketing). The
patch's own work was ≈ 11 ms of ≈ 190 ms per batch: exact scorer 4.6 ms, top-k 0.6 ms,
gather / two (B, L, d) scatters / per-group masks 5.7 ms. Fixes: c per thread; no scatter
for CLS-reading classifiers; gather and scatter as one flat index_select / index_copy_ (2–3×
and 1.5× faster at B = 32). Kept: the exact "received" scorer (``scorer_queries=0``): the
sampled one keeps other tokens (overlap of kept tokens with the exact scorer on 512 tweets:
0.74 at S = 8, 0.81 at 16, 0.87 at 24; far below 0.95), and the exact scorer is only
≈ 2.5 % of the pruned forward at batch 32 (not timed against the sampled one).
At batch 1 the layers' matmuls are bound by reading the weights (a MiniLM layer on 24 tokens
takes 1.5 ms against 1.9 ms on 48), so halving the tokens after layer 2 saves ≈ 1.6 ms of
≈ 12 ms at best; the patch's own work is ≈ 1 ms of that (scorer ≈ 0.3 ms, top-k and gather
≈ 0.15 ms each, the rest per-op dispatch), so batch-1 wall time stays near the full model's.

Written by hand: no library prunes tokens inside the stock HF encoder loop, nor buckets the rows
of a batch whose lengths change between its layers.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor, nn

from attnprune.attention import SCORER_KERNELS, attention_received, scorer_attention
from attnprune.compat import ModelOutput, size_hint
from attnprune.hosts import (
    CallData,
    Calls,
    LastCall,
    PatchState,
    add_method_module,
    bracket_calls,
    check_attn_implementation,
    refuse_output_flags,
    register_host,
    remove_method_module,
    remove_state_hooks,
    replace_forward,
    restore_forward,
)
from attnprune.methods import registry
from attnprune.methods.base import protect_first, protect_special
from attnprune.selection import (
    check_keep_ratio,
    gather_tokens,
    group_overhead_slots,
    key_metric,
    merge_tokens,
    row_groups,
    scatter_tokens,
)

__all__ = [
    "GROUP_OVERHEAD_PER_THREAD",
    "GROUP_OVERHEAD_TOKENS",
    "MERGE_MIN_TOKENS",
    "REDUCE",
    "HFEncoderState",
    "LazyStats",
    "group_overhead_tokens",
    "parse_schedule",
    "patch_hf_encoder",
    "stock_calls",
    "sync_free",
]

# Deprecated (until 0.3): the old c per thread at MiniLM's width; unused, the measured model
# selection.group_overhead_slots(d, block="encoder") replaced it.
GROUP_OVERHEAD_PER_THREAD = 24
REDUCE = ("drop", "merge")  # what happens to the tokens a selection does not keep
# Rows with fewer real tokens than this stay whole in a SentenceTransformer that merges (its
# min_tokens default): short texts lose most by any reduction (a 9-token query keeps 4 at
# ρ = 0.5) and cost least.
MERGE_MIN_TOKENS = 16
GROUP_OVERHEAD_TOKENS: float | None = None  # a fixed c overrides the measured model (tests)


def group_overhead_tokens(d_model: int = 384) -> float:
    """c for :func:`attnprune.selection.row_groups` at width ``d_model`` and torch's current
    thread count: ``GROUP_OVERHEAD_TOKENS`` if set, else
    :func:`attnprune.selection.group_overhead_slots`."""
    if GROUP_OVERHEAD_TOKENS is not None:
        return GROUP_OVERHEAD_TOKENS
    return group_overhead_slots(d_model, block="encoder")


# ----------------------------------------------------------------------------- schedules
def parse_schedule(
    keep_ratio: float | Sequence[float] | None,
    n_layers: int,
    after_layer: int = 1,
    schedule: str | float | Sequence[float] | None = None,
) -> tuple[float, ...]:
    """The cumulative keep ratio r_l after each of the ``n_layers`` layers (ToMe's ``parse_r``).

    r_l is the share of the original real tokens still present after layer l (1-based);
    r is non-increasing, and the last layer never prunes (nothing reads its dropped tokens).
    Accepted forms:

    * ``schedule`` None / ``"single"`` and a number ρ: prune once after layer ``after_layer``:
      r = (1, …, 1, ρ, ρ, …).
    * ``schedule="geometric"``: prune by ρ after every layer from ``after_layer`` on:
      r = (1, …, 1, ρ, ρ², ρ³, …).
    * ``schedule="linear"``: the same number of tokens after every layer from ``after_layer``
      to the last but one, down to ρ (ToMe's constant r per layer): r falls by
      (1 − ρ) / (n_layers − after_layer) a layer.
    * ``schedule`` or ``keep_ratio`` a list of per-layer cumulative ratios, length
      ``n_layers − 1`` or ``n_layers`` (the last value is then ignored).

    Bad values raise ValueError naming the field.
    """
    if n_layers < 2:
        raise ValueError(f"n_layers must be ≥ 2 to prune between layers, got {n_layers}")
    explicit = None
    if isinstance(schedule, (list, tuple)):
        explicit = schedule
    elif isinstance(keep_ratio, (list, tuple)):
        explicit, schedule = keep_ratio, None
    elif isinstance(schedule, str) and schedule.strip().startswith("["):
        import yaml

        explicit = yaml.safe_load(schedule)
    if explicit is not None:
        vals = [check_keep_ratio(v, f"schedule[{i}]") for i, v in enumerate(explicit)]
        if len(vals) not in (n_layers - 1, n_layers):
            raise ValueError(f"schedule: give {n_layers - 1} or {n_layers} values (one per "
                             f"layer), got {len(vals)}")
        vals = vals[: n_layers - 1]
        for i in range(1, len(vals)):
            if vals[i] > vals[i - 1] + 1e-12:
                raise ValueError(f"schedule: cumulative keep ratios must not increase, got "
                                 f"{vals[i - 1]} then {vals[i]} at layer {i + 1}")
        return (*vals, vals[-1])
    if schedule is None or isinstance(schedule, (int, float)):
        rule = "single"
        if isinstance(schedule, (int, float)):
            keep_ratio = schedule
    else:
        rule = str(schedule).strip().lower()
    if rule not in ("single", "geometric", "linear"):
        raise ValueError(f"schedule: must be 'single', 'geometric', 'linear' or a list of "
                         f"per-layer keep ratios, got {schedule!r}")
    rho = check_keep_ratio(1.0 if keep_ratio is None else keep_ratio)
    if isinstance(after_layer, bool) or not isinstance(after_layer, int):
        raise ValueError(f"after_layer must be an integer, got {after_layer!r}")  # noqa: TRY004 (patch() contract: ValueError)
    if not 1 <= after_layer <= n_layers - 1:
        raise ValueError(f"after_layer must be in [1, {n_layers - 1}] for a {n_layers}-layer "
                         f"model, got {after_layer}")
    out = []
    for layer in range(1, n_layers + 1):
        steps = layer - after_layer + 1
        if steps <= 0:
            out.append(1.0)
        elif rule == "single":
            out.append(rho)
        elif rule == "linear":
            steps = min(steps, n_layers - after_layer)
            out.append(1.0 - (1.0 - rho) * steps / (n_layers - after_layer))
        else:
            out.append(rho ** min(steps, n_layers - after_layer))
    return tuple(out)


# Set by :func:`stock_calls`: forwards in this context (thread, task) run the stock encoder.
_STOCK: contextvars.ContextVar[bool] = contextvars.ContextVar("attnprune_stock", default=False)


@contextlib.contextmanager
def stock_calls():
    """Inside this context every patched encoder forward of this thread (or asyncio task) runs
    the stock encoder loop, without touching the shared patch (``enabled``), so other threads
    serving the same model keep theirs: a SentenceTransformer's queries with
    ``reduce_queries=False``."""
    token = _STOCK.set(True)
    try:
        yield
    finally:
        _STOCK.reset(token)


def _stock() -> bool:
    """Whether :func:`stock_calls` is on here; never while compiling (dynamo cannot trace a
    ContextVar read: a compiled graph is the patched forward, and stock_calls is eager-only)."""
    return not torch.compiler.is_compiling() and _STOCK.get()


# ----------------------------------------------------------------------------- model anatomy
def _family(model: nn.Module) -> str | None:
    """The anatomy name of the model's encoder family (``FAMILIES[model_type].token``: 'bert'
    for BERT, MiniLM, RoBERTa, XLM-R, CamemBERT, ELECTRA; 'distilbert', 'albert', 'mpnet',
    'deberta', 'modernbert'), 'refused' for a model the host refuses (a family the table
    refuses, or an encoder family configured as a decoder; patch says why), None for anything
    else (decoders, which have their own token hosts)."""
    from attnprune.hosts.hf_attention import family

    base = getattr(model, "base_model", None)
    fam = family(model)
    if base is None:
        return None
    if fam.token and _decoder_flags(base.config):
        return "refused"
    return fam.token or ("refused" if fam.token_refused else None)


def _decoder_flags(config) -> list[str]:
    """The config flags that make an encoder family a decoder (``is_decoder``: causal
    self-attention; ``add_cross_attention``: cross-attention over encoder states)."""
    return [f"{k}=True" for k in ("is_decoder", "add_cross_attention") if getattr(config, k, False)]


def _refusal(model: nn.Module) -> str:
    """Why token methods cannot run on ``model`` (one :func:`_family` calls 'refused')."""
    from attnprune.hosts.hf_attention import family

    flags = _decoder_flags(model.base_model.config)
    if flags:
        # the same class is served as an encoder: say which setting makes the difference
        return (f"it is configured as a decoder ({', '.join(flags)}). The token host runs "
                f"encoders: it rebuilds a bidirectional mask for the kept tokens (each would "
                f"see the tokens after it) and passes no encoder states to cross-attention. "
                f"Build it with is_decoder=False and add_cross_attention=False to prune "
                f"tokens, or use an attention method (crisp, intensity, cost), which runs on it "
                f"as it is")
    return family(model).token_refused


def _anatomy(model: nn.Module) -> tuple[str, nn.Module, list[nn.Module], list[tuple[nn.Module, nn.Module]]]:
    """(family, encoder module, layers, [(query linear, key linear)] per layer)."""
    from attnprune.hosts.hf_encoder_families import ANATOMIES

    fam = _family(model)
    if fam == "refused":
        raise ValueError(f"model: {type(model).__name__} ({model.config.model_type}) is not "
                         f"supported by token methods: {_refusal(model)}")
    anatomy = ANATOMIES[fam]
    if anatomy.check is not None:
        anatomy.check(model)
    base = model.base_model
    enc = anatomy.encoder(base)
    layers = anatomy.layers(base, enc)
    return fam, enc, layers, [anatomy.qk(lay) for lay in layers]


def _key_mask(mask4d: Tensor | None, B: int, L: int, device) -> Tensor:
    """(B, L) bool real-token mask from the 4D mask HF built (None, bool, or additive float)."""
    if mask4d is None:
        return torch.ones(B, L, dtype=torch.bool, device=device)
    row = mask4d[:, 0, 0, :]  # bidirectional: every query row holds the same key mask
    if row.dtype == torch.bool:
        return row.clone()
    return row > torch.finfo(row.dtype).min / 2


# ----------------------------------------------------------------------------- the state
class _Call(CallData):
    """One forward's own data (:class:`attnprune.hosts.Calls`): what the hooks capture and the
    loop reads back within the call, and what it leaves for its caller (``kept_mask``,
    ``aux_losses``, ``stats``). Per call and thread, never on the shared state, so one patched
    model serves several threads (a web server's pool) and forwards run inside its own forward
    (a teacher pass in a hook): no call reads another's labels, token ids, q/k projections or
    tables."""

    def __init__(self) -> None:
        super().__init__()
        self.kept_mask: Tensor | None = None  # (B, L): the positions the last layer computed
        self.sizes: Tensor | None = None  # (B, L) merging: originals per kept position
        self.source: Tensor | None = None  # (B, L) merging: each position's representative
        self.scorer_time_s = self.select_time_s = self.gather_time_s = 0.0
        self.release()

    def release(self) -> None:
        """Drop what only the encoder loop reads (at its end: a finished call stays readable
        by its caller until the thread's next one, and need not hold tables and masks)."""
        self.labels: Tensor | None = None  # the sequence labels of this forward (training losses)
        self.rank: Callable[[Tensor, Tensor], Tensor] | None = None  # HFEncoderState.set_rank_loss
        self.inputs: tuple | None = None  # (input_ids, token_type_ids), to find the separators
        self.want: nn.Module | None = None  # the query linear whose layer is being scored
        self.captured: dict[str, Tensor] = {}  # its q and k projections
        self.family_cache: dict = {}  # per-forward tables of the family (hf_encoder_families)
        self.family_index: Tensor | None = None
        self.family_positions: Tensor | None = None
        self.soft_bias: Tensor | None = None  # the layers' mask when it is the soft log-mask bias


class HFEncoderState(PatchState):
    """What the patch leaves on the model: the schedule, the hooks, the last forward's stats.

    ``stats`` after each forward: ``real_tokens`` (sum of real tokens in the batch),
    ``kept_per_layer`` (real tokens entering each layer, summed over the batch; soft mask sums
    in training), ``padded_per_layer`` (B·K_l, what the layer computes), ``kept_ratio``
    (Σ_l kept_l / (n_layers · real_tokens): the share of token-layer work done).
    ``kept_per_layer`` and ``padded_per_layer`` are summed over row groups when bucketing.
    On the sync-free path (:func:`sync_free`) the counts stay on the device until ``stats`` is
    read (:class:`LazyStats`); under ``torch.compile`` / export ``stats`` is empty.
    ``stats``, ``aux_losses`` and ``kept_mask`` are those of the calling thread's last forward
    (``calls``, :class:`attnprune.hosts.Calls`; empty before any).
    ``enabled = False`` runs the stock encoder (used to time the full model in one process);
    ``bucket_rows`` may be switched between forwards.
    """

    def __init__(self, method: str, module: nn.Module, encoder: nn.Module, layers, qk,
                 schedule: tuple[float, ...], keep_ratio: float, config, family: str,
                 output: str, soft_mode: str, bucket_rows: bool = True,
                 sync_free: bool | None = None) -> None:
        self.calls = Calls(_Call)  # before PatchState's __init__, which sets aux_losses and stats
        super().__init__(method, module)
        self.encoder = encoder
        self.layers = layers
        self.qk = qk
        self.schedule = schedule
        self.keep_ratio = keep_ratio
        self.config = config
        self.family = family
        self.output = output
        self.soft_mode = soft_mode
        self.enabled = True
        self.bucket_rows = bucket_rows
        self.sync_free = sync_free  # None: by device (:func:`sync_free`)
        self.protect_ids: tuple[int, ...] = ()  # token ids kept like CLS (separators)
        self._protect_tensors: dict = {}  # protect_ids as a tensor per device (no copy per call)
        self._handles: list = []
        self._rank: dict = {}  # thread id → the rank loss of its next forward (set_rank_loss)

    @property
    def anatomy(self):
        """The family's :class:`~attnprune.hosts.hf_encoder_families.Anatomy`, looked up by
        name: the table's functions (lambdas among them) never enter a pickle of the model.
        Setting it (tests swap a step) overrides the table for this state."""
        override = self.__dict__.get("_anatomy")
        if override is not None:
            return override
        from attnprune.hosts.hf_encoder_families import ANATOMIES

        return ANATOMIES[self.family]

    @anatomy.setter
    def anatomy(self, value) -> None:
        self.__dict__["_anatomy"] = value

    # -- per-call data: the calling thread's last forward's ----------------------------------
    aux_losses = LastCall()
    stats = LastCall()
    kept_mask = LastCall(
        """(B, L) bool of the last forward on this thread: True at the positions the last
        layer computed (the kept tokens: their states in ``last_hidden_state`` are the pruned
        model's output); False at padding and at dropped tokens, whose scattered states are
        the ones of the layer that dropped them. Every real token at keep ratio 1 or with
        ``enabled = False``. The model's output carries the same tensor as ``.kept_mask``
        (a ``ModelOutput``; not with ``return_dict=False``). None before any forward.
        Per thread: two threads serving one model each read their own call's.""")

    sizes = LastCall(
        """(B, L) float32 of the last forward on this thread when merging (``reduce="merge"``):
        at each kept position (``kept_mask``) how many original tokens it stands for (its own
        and those merged into it), 0 elsewhere; a row sums to its real tokens. None when the
        patch drops tokens. Also ``output.sizes``.""")
    source = LastCall(
        """(B, L) long of the last forward on this thread when merging: for every original
        position the original position of its representative (the kept token it was merged
        into, itself when kept, itself at padding). With ``output="scatter"`` the output at
        position p is the representative's state, ``last_hidden_state[b, source[b, p]]``.
        None when the patch drops tokens. Also ``output.source``.""")

    def set_rank_loss(self, loss: Callable[[Tensor, Tensor], Tensor] | None) -> None:
        """``loss(student (B, L), mask) -> Tensor`` for the calling thread's next forward
        only, in training: added to its ``aux_losses`` at the first pruning layer, on the
        scorer's token distribution there (ranking distillation,
        :mod:`attnprune.train.rank_distill`). None withdraws it."""
        if loss is None:
            self._rank.pop(threading.get_ident(), None)
        else:
            self._rank[threading.get_ident()] = loss

    def mask4d(self, hidden: Tensor, attention_mask: Tensor):
        """The layers' mask for the uncut batch from a (B, L) padding mask, for a family's
        ``forward``: the stock helper, without its "no padding, no mask" shortcut on the
        sync-free path (the shortcut reads the mask back: ``mask.all()``)."""
        return _bidirectional(self, hidden, attention_mask,
                              skip=not sync_free(hidden.device, self.sync_free))

    def protect_tensor(self, device) -> Tensor | None:
        """``protect_ids`` as a long tensor on ``device``, made once: building it in every
        forward would copy host → device, which waits for the device."""
        if not self.protect_ids:
            return None
        key = str(device)
        t = self._protect_tensors.get(key)
        if t is None:
            t = self._protect_tensors[key] = torch.tensor(self.protect_ids, dtype=torch.long,
                                                          device=device)
        return t

    # -- copies and pickles: no per-device tensors, no pending rank loss (a closure) --------
    def __getstate__(self) -> dict:
        return {**self.__dict__, "_protect_tensors": {}, "_rank": {}}

    def unpatch(self, model: nn.Module) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        remove_state_hooks(model, self)
        restore_forward(self.encoder)
        remove_method_module(model, self.modules)

    # -- attention probabilities for the scorer -------------------------------------------
    def _attention(self, run: _Pass, layer: int, keymask_add: Tensor, mask: Tensor) -> Tensor:
        """Attention probabilities of layer ``layer`` from the captured q, k projections, in
        the form the method declares (``run.rows``; :func:`attnprune.attention.scorer_attention`),
        with the family's own score terms (``Anatomy.scores``). ``keymask_add`` (B, L) is the
        additive key bias (padding, soft masks)."""
        t0 = _clock(run)
        q, k = run.call.captured.pop("q"), run.call.captured.pop("k")  # (B, L, H·dh)
        extra = None  # the family's own score terms (B|1, 1|H, L, L): relative bias, window, …
        if self.anatomy.scores is not None:
            q, k, extra = self.anatomy.scores(self, layer, q, k)
        out = scorer_attention(q, k, keymask_add, mask, self.n_heads, run.rows, extra=extra,
                               queries=self.scorer_queries,
                               kernel=getattr(self, "scorer_kernel", "matmul"),
                               training=run.training, static=run.static, sync_free=run.sync_free)
        run.call.scorer_time_s += _clock(run) - t0
        return out


# ----------------------------------------------------------------------------- the path by device
def sync_free(device: torch.device, override: bool | None = None) -> bool:
    """Whether a forward on ``device`` takes the sync-free path: the one place the host chooses
    its path by device (``patch(..., sync_free=True/False)`` overrides it).

    * CPU (default: False): the host reads counts back freely (a CPU tensor read costs
      nanoseconds) to cut each gather to the batch's longest kept row and to split rows of
      different kept counts into groups (row bucketing, measured faster on 2 cores: see the
      module docstring).
    * Any other device (CUDA, MPS, …) (default: True): reading a number back waits for every
      queued kernel, and each extra launch costs microseconds, as much as a small layer's work.
      So the forward never reads the device: a fixed-ratio method's gather width is
      W = min(K, max(⌊ρ·K⌋, 4)) from the batch's padded width K alone (every row keeps
      ⌊ρ·n_b⌋ ≤ W tokens; shorter rows are padded, with a mask), one top-k and one batched
      gather per pruning layer, no row groups, the per-layer counts kept as device tensors
      until ``stats`` is read, and the scorer's attention in few large pieces. A threshold
      method (``variable_budget``: LTP, entropy_threshold, DTR, hybrid) reads its largest kept
      count back once per pruning layer (one sync each: its width is data, and a width fixed
      in advance would either cut kept tokens or keep all of them).
    * Traced (``torch.compile``): the same path, without statistics or timers (nothing may
      leave the graph); ``torch.export`` / ONNX keep data-dependent widths
      (:func:`_traced_width`), so an exported graph keeps exactly the eager forward's tokens.

    W ≥ 4 holds a sentence pair's CLS and separators ([CLS] a [SEP] b [SEP]; RoBERTa's
    <s> a </s></s> b </s>), so both paths keep the same tokens on single texts and pairs. Only
    a row with more protected tokens than W (separators written inside a text, three or more
    segments, and ⌊ρ·K⌋ below their count) keeps its first W of them on this path, where the
    CPU path keeps them all: counting them would read the device.
    """
    if _tracing():
        return True
    if override is not None:
        return override
    return device.type != "cpu"


# The most protected tokens (CLS and separators) of a standard input: a RoBERTa pair's
# <s> a </s></s> b </s> (a BERT pair has 3, a single text 2). The sync-free gather is never
# narrower, so it keeps them all, as the CPU path does (:func:`sync_free`).
PAIR_PROTECTED = 4


def _fixed_width(width: int, rho: float, floor: int = 0) -> int:
    """W = min(K, max(⌊ρ·K⌋, PAIR_PROTECTED, min_tokens − 1)): the gather width of a fixed-ratio method from
    the padded width K alone (:func:`sync_free`). ⌊ρ·n_b⌋ ≤ ⌊ρ·K⌋ for every row (n_b ≤ K real
    tokens); at least 4 so a pair's CLS and separators fit (kept by every selection, however
    small ⌊ρ·n_b⌋: the CPU path keeps them all); a row under the short-input floor
    (``floor`` = ``min_tokens``) keeps its n_b ≤ floor − 1 tokens; the 1e-9 is ``selection.budget``'s guard
    against float error (0.7·10 = 6.999…)."""
    return min(width, max(math.floor(width * rho + 1e-9), PAIR_PROTECTED, floor - 1))


def _clock(run) -> float:
    """perf_counter for the host's own timers; 0 when traced (a timer would break the graph)."""
    return 0.0 if run.static else time.perf_counter()


class LazyStats(Mapping):
    """The last forward's statistics, whose counts stayed on the device (sync-free path):
    converted to numbers the first time ``stats`` is read, so the forward itself never
    waits for the device. A read-only mapping (``dict(stats)`` for a plain dict, e.g. to
    write it as JSON: a dict subclass would let ``json.dumps`` see it empty)."""

    def __init__(self, make) -> None:
        self._make = make
        self._data: dict | None = None

    def _fill(self) -> dict:
        if self._data is None:
            self._data, self._make = self._make(), None
        return self._data

    def __getitem__(self, key):
        return self._fill()[key]

    def __iter__(self):
        return iter(self._fill())

    def __len__(self) -> int:
        return len(self._fill())

    def __repr__(self) -> str:
        return f"LazyStats({self._fill()!r})"

    def __reduce__(self):  # a copy or pickle of the stats holds the numbers
        return (dict, (dict(self._fill()),))


# ----------------------------------------------------------------------------- the loop
@dataclass
class _Pass:
    """What one forward's layer loop reads at every level of row bucketing."""

    call: _Call  # this forward's own data (captured q/k, labels, family tables, timers)
    method: nn.Module
    training: bool
    rows: str  # the method's attention_rows
    labels: Tensor | None
    kwargs: dict  # passed to every layer (position_ids dropped after the first gather)
    bucket: bool
    static: bool  # traced (export / compile): no statistics, timers nor Python reads
    sync_free: bool  # never read the device (:func:`sync_free`); implied by static
    exporting: bool  # torch.export / ONNX / jit trace: data-dependent widths (_traced_width)
    kept: list  # real tokens (soft mask sums in training) entering layer l, all groups
    padded: list  # token slots layer l computes, summed over groups
    length: int  # L, the input's width (the kept mask is (B, L))
    merge: bool = False  # reduce="merge": unkept tokens are averaged into kept ones
    floor: int = 0  # rows with fewer real tokens than this are never reduced (min_tokens)
    # tokens every selection must keep (protected) that a fixed sync-free width left out,
    # per pruning layer, as device counts (read with the stats, never during the forward)
    cut: list = field(default_factory=list)


def _encoder_forward(state: HFEncoderState, original, *args, **kwargs):
    """The encoder's forward while patched (``replace_forward``): the family's own steps
    around the pruned loop (``Anatomy.forward``), in the running call, the model's. An encoder
    run without the model's entry (``model.base_model``, the encoder alone) gets a call of its
    own, so it never reads another forward's data and its caller still reads its results."""
    calls = state.calls
    own = not calls.running()
    call = calls.begin() if own else calls.current()
    try:
        wrap = state.anatomy.forward
        if wrap is None:
            return _pruned_forward(state, original, *args, **kwargs)
        return wrap(state, _pruned_forward, original, *args, **kwargs)
    finally:
        call.release()
        if own:
            calls.end()


def _pruned_forward(state: HFEncoderState, original, hidden_states, attention_mask=None,
                    *args, **kwargs):
    """The pruned encoder loop in the running call (the ``inner`` of ``Anatomy.forward``)."""
    return _run(state, state.calls.current(), original, hidden_states, attention_mask, *args,
                **kwargs)


def _run(state: HFEncoderState, call: _Call, original, hidden_states, attention_mask=None,
         *args, **kwargs):
    """The body of :func:`_pruned_forward` for one call."""
    if not state.enabled or _stock():
        return original(hidden_states, attention_mask, *args, **kwargs)
    if args or kwargs.get("encoder_hidden_states") is not None:
        raise ValueError("hf_encoder: cross-attention (encoder_hidden_states) is not supported")
    check_attn_implementation(state.config, "hf_encoder")
    kwargs.pop("encoder_attention_mask", None)
    kwargs.pop("past_key_values", None)
    kwargs.pop("cache", None)  # the cache's name from transformers 5.24 on
    kwargs.pop("use_cache", None)
    training = state.encoder.training
    B, L, _ = hidden_states.shape
    mask = _key_mask(attention_mask, B, L, hidden_states.device)  # (B, L) real tokens
    static = _tracing()
    free = sync_free(hidden_states.device, state.sync_free)
    n = len(state.layers)
    method = state.modules
    # Row bucketing at inference on the CPU path only: training keeps one padded batch (soft
    # masks, and losses over the batch); the sync-free path never reads counts back.
    merge = getattr(state, "reduce", "drop") == "merge"
    run = _Pass(call=call, method=method, training=training,
                rows=getattr(method, "attention_rows", "all"),
                labels=call.labels if training else None, kwargs=kwargs,
                bucket=state.bucket_rows and not training and not free, static=static,
                sync_free=free, exporting=_exporting(),
                kept=[0.0] * n, padded=[0] * n, length=L, merge=merge,
                floor=getattr(state, "min_tokens", 0))
    index = torch.arange(L, device=mask.device).expand(B, L)  # original positions
    full = hidden_states if state.output == "scatter" else None
    ids, token_types = call.inputs or (None, None)
    special = state.protect_tensor(mask.device) if ids is not None else None
    protect = protect_special(mask, ids, token_types, () if special is None else special)
    # merging: every original position's current slot (−1 at padding), read at the end to
    # give each position its representative's state (the source map)
    tokens = _Tokens(
        size=None,
        src=torch.where(mask, index, torch.full((), -1, dtype=index.dtype, device=mask.device))
        if merge else None,
        whole=(mask.sum(1) < run.floor) if run.floor > 0 else None)
    hidden_states, _, kept_mask, merged = _layers(state, run, 0, hidden_states, mask,
                                                  attention_mask, index, full,
                                                  protect=protect, tokens=tokens)
    call.kept_mask = kept_mask  # read by the caller (HFEncoderState.kept_mask, output.kept_mask)
    call.sizes, call.source = merged if merged is not None else (None, None)
    if static:  # the counts are data: a traced graph has no place for them
        return state.output_cls(last_hidden_state=hidden_states)
    times = {
        "attention_time_s": call.scorer_time_s,  # A⁽ˡ⁾ for the scorer
        "select_time_s": call.select_time_s,  # A⁽ˡ⁾ + the method's scoring and top-k
        "gather_time_s": call.gather_time_s,  # gather, scatter, the new masks, groups
    }
    if free:  # counts stay on the device until read (host timers: launches only, on a GPU)
        kept, padded, real, cut = run.kept, run.padded, mask.sum(), run.cut
        call.stats = LazyStats(lambda: _warn_cut(state, _stats(kept, padded, real, n, times,
                                                                cut)))
    else:
        call.stats = _stats(run.kept, run.padded, mask.sum(), n, times)
    return state.output_cls(last_hidden_state=hidden_states)


def _rank_loss(call: _Call, attn: Tensor, mask: Tensor) -> None:
    """An auxiliary loss on the scorer's token distribution at the first cut, once per call:
    ``call.rank`` is a callable ``(student (B, L), mask) -> loss`` handed in by the training
    layer (ranking distillation, :mod:`attnprune.train.rank_distill`); the scorer's attention
    is (B, H, 1, L) rows or (B, H, L, L)."""
    loss_fn = call.rank
    call.rank = None
    student = attn[:, :, 0, :].mean(1) if attn.shape[-2] == 1 else attention_received(attn, mask)
    call.aux_losses.append(loss_fn(student, mask))


def _stats(kept: list, padded: list, real, n: int, times: dict | None,
           cut: list | None = None) -> dict:
    """The ``stats`` dict from per-layer counts (numbers or device tensors)."""
    kept = [float(k) for k in kept]
    real = int(real)
    out = {"real_tokens": real, "kept_per_layer": kept, "padded_per_layer": [int(p) for p in padded],
           "kept_ratio": sum(kept) / max(n * real, 1)}
    if cut is not None:  # the sync-free path: protected tokens its fixed width left out
        out["protected_cut"] = int(sum(int(c) for c in cut))
    out.update(times or {})
    return out


def _warn_cut(state: HFEncoderState, stats: dict) -> dict:
    """Once per patch, when the stats of a sync-free forward are read: a row had more
    protected tokens (CLS, separators, ``protect_token_ids``) than the fixed gather width
    ⌊ρ·K⌋ (at least ``PAIR_PROTECTED``) holds, so that path dropped some the CPU path keeps.
    Knowing it during the forward would mean reading the device, which that path never does."""
    if stats.get("protected_cut", 0) > 0 and not getattr(state, "_warned_cut", False):
        state._warned_cut = True
        warnings.warn(
            f"sync-free path: {stats['protected_cut']} protected token(s) (CLS, separators, "
            f"protect_token_ids) did not fit the fixed gather width max(floor(keep_ratio*K), "
            f"{PAIR_PROTECTED}) and were dropped, where the CPU path keeps them; raise "
            f"keep_ratio, protect fewer ids, or patch with sync_free=False", stacklevel=2)
    return stats


@dataclass
class _Tokens:
    """What rows carry through the loop besides their states, for merging and the short-input
    floor (each None when unused): ``size`` (b, K) float32, how many original tokens each slot
    stands for (None: all 1); ``src`` (b, L) long, each original position's current slot (−1
    at padding); ``whole`` (b,) bool, rows never reduced (fewer real tokens than
    ``min_tokens``)."""

    size: Tensor | None = None
    src: Tensor | None = None
    whole: Tensor | None = None

    def rows(self, rows: Tensor, k: int) -> _Tokens:
        """The same for the rows ``rows`` cut to their first ``k`` slots (a row group)."""
        return _Tokens(None if self.size is None else self.size[rows, :k],
                       None if self.src is None else self.src[rows],
                       None if self.whole is None else self.whole[rows])


def _layers(state: HFEncoderState, run: _Pass, start: int, hidden: Tensor, mask: Tensor,
            mask4d, index: Tensor, full: Tensor | None, gathered: bool = False,
            protect: Tensor | None = None, tokens: _Tokens | None = None
            ) -> tuple[Tensor, Tensor | None, Tensor, tuple | None]:
    """Layers ``start``, ``start + 1``, … on b rows, in the host's output format.

    ``hidden`` (b, K, d) the tokens still present in ascending original order, ``mask``
    (b, K) their real slots, ``mask4d`` the layers' attention mask for them, ``index`` (b, K)
    their original positions, ``full`` (b, L, d) every token's state so far (dropped tokens'
    last states; None for ``output="short"``), ``gathered`` whether a gather already happened,
    ``protect`` (b, K) the tokens every selection keeps (CLS and separators; None: CLS only).
    ``tokens``: sizes, source map and unreduced rows (:class:`_Tokens`).
    Returns ((b, L, d) final states, None, kept, merged) for ``output="scatter"``, or the
    compact ((b, K', d), (b, K') mask, kept, merged) for ``output="short"``; kept (b, L) bool
    marks the original positions the last layer computed (:func:`_kept_positions`); merged is
    None, or when merging ((b, L) sizes at the kept positions, (b, L) source map:
    :func:`_merged_outputs`), and with ``output="scatter"`` every real position then holds
    its representative's final state. After a gather at inference on the CPU path the rows
    may be split into groups (:func:`_grouped`), each running the rest of this loop.
    """
    method = run.method
    call = run.call
    n = len(state.layers)
    tokens = tokens or _Tokens()
    soft_total: Tensor | None = None  # (b, K) product of the soft masks so far (training)
    # One row without padding (batch-1 serving, CPU path) stays without padding after any
    # gather: every slot is real, so the counts are the width, the gather is one index_select
    # of the kept positions, and the layers keep mask None (the stock no-padding SDPA call)
    # instead of a mask rebuilt by create_bidirectional_mask at every pruning layer.
    single = (not (run.sync_free or run.training or run.merge) and mask4d is None
              and hidden.shape[0] == 1)
    if protect is None:
        protect = protect_first(mask)
    for i in range(start, n):
        layer = state.layers[i]
        prune = i < n - 1 and state.schedule[i] < (state.schedule[i - 1] if i else 1.0) - 1e-12
        need_attn = prune and method.needs_attention
        need_keys = prune and (run.merge or getattr(method, "needs_keys", False))
        if single:
            run.kept[i] += hidden.shape[1]
            run.padded[i] += hidden.shape[1]
        elif not run.static:  # numbers on the CPU path, device tensors on the sync-free one
            count = soft_total.detach().sum() if soft_total is not None else mask.sum()
            run.kept[i] += count if run.sync_free else float(count)
            run.padded[i] += mask.numel()
        call.want = state.qk[i][0] if need_attn or need_keys else None  # hooks keep its q, k
        hidden = (layer(hidden, mask4d, **run.kwargs) if state.anatomy.call is None
                  else state.anatomy.call(state, i, hidden, mask4d, index))  # positions: index
        if not prune:
            continue
        rho = state.schedule[i] / (state.schedule[i - 1] if i else 1.0)
        attn = None
        t0 = _clock(run)
        keys = _keys(state, i, call.captured.get("k")) if need_keys else None
        if need_attn:
            add = _additive(mask, _weights(soft_total, tokens.size), hidden.dtype)
            attn = state._attention(run, i, add, mask)
            if run.training and call.rank is not None and not gathered:
                _rank_loss(call, attn, mask)
        call.captured.clear()
        extra = {"keys": keys} if getattr(method, "needs_keys", False) else {}
        sel = method(hidden, mask, attn=attn, keep_ratio=rho, layer=i,
                     labels=run.labels, protect=protect, **extra)
        t1 = _clock(run)
        call.select_time_s += t1 - t0
        if sel.aux_loss is not None:
            call.aux_losses.append(sel.aux_loss)
        if run.training and sel.soft is not None:
            soft = sel.soft * mask.to(sel.soft.dtype)
            soft = torch.where(protect, torch.ones_like(soft), soft)
            soft_total = soft if soft_total is None else soft_total * soft
            if state.soft_mode == "multiply":
                hidden = hidden * soft[..., None]
            else:  # log-mask bias on the keys of every later layer
                mask4d = call.soft_bias = _additive(mask, soft_total, hidden.dtype)[:, None, None, :]
            continue
        keep = (sel.keep | protect) & mask  # the host's guarantee, whatever the method did
        if tokens.whole is not None:  # short inputs stay whole
            keep = keep | (tokens.whole[:, None] & mask)
        dest = None
        if run.merge:
            metric = key_metric(hidden.detach() if keys is None else keys.detach(),
                                None if keys is None else state.n_heads)
            hidden, size, dest = merge_tokens(hidden, mask, keep, metric, tokens.size,
                                              protect, sel.merge_into)
        elif full is not None:  # merging reads final states through the source map instead
            full = scatter_tokens(full, hidden, index, mask)
        if single:
            pos = keep[0].nonzero().squeeze(1)  # (K',) kept positions, ascending
            if pos.numel() > 0:
                hidden, index = hidden.index_select(1, pos), index.index_select(1, pos)
                protect = protect.index_select(1, pos)  # follows its tokens
                mask = mask.new_ones(1, pos.numel())
                gathered = True
                run.kwargs.pop("position_ids", None)
                call.gather_time_s += time.perf_counter() - t1
                continue
        width = _width(run, keep, rho)
        if width is not None and run.sync_free and not run.static:
            run.cut.append((keep.sum(1) - width).clamp_min(0).sum())  # no read: a device count
        g, index = (gather_tokens(hidden, keep, index) if width is None
                    else gather_tokens(hidden, keep, index, size=width))
        hidden, mask = g.hidden, g.mask
        protect = torch.gather(protect, 1, g.index) & mask  # follows its tokens
        if run.merge:
            tokens = _Tokens(torch.gather(size, 1, g.index) * mask,
                             _follow(tokens.src, dest, g.index, mask), tokens.whole)
        gathered = True
        run.kwargs.pop("position_ids", None)
        if soft_total is not None:
            soft_total = torch.gather(soft_total, 1, g.index)
            mask4d = call.soft_bias = _additive(mask, _weights(soft_total, tokens.size),
                                                hidden.dtype)[:, None, None, :]
        else:
            if run.bucket and hidden.shape[0] > 1:
                groups = row_groups(mask.sum(1), group_overhead_tokens(hidden.shape[-1]))
                if len(groups) > 1:
                    call.gather_time_s += time.perf_counter() - t1
                    return _grouped(state, run, i + 1, groups, hidden, mask, index, full,
                                    protect, tokens)
            mask4d = _layer_mask(state, run, hidden, mask, tokens)
        call.gather_time_s += _clock(run) - t1
    kept = _kept_positions(index, mask, run.length)
    merged = _merged_outputs(index, mask, tokens, run.length) if run.merge else None
    if full is None:
        return hidden, mask, kept, merged
    if gathered:  # even with K = L, rows may have shifted
        t0 = _clock(run)
        if run.merge:  # every real position reads its representative's state
            src = tokens.src
            rep = torch.gather(hidden, 1, src.clamp_min(0)[..., None].expand(*src.shape,
                                                                            hidden.shape[-1]))
            full = torch.where((src >= 0)[..., None], rep.to(full.dtype), full)
        else:
            full = scatter_tokens(full, hidden, index, mask)
        call.gather_time_s += _clock(run) - t0
        return full, None, kept, merged
    return hidden, None, kept, merged


def _keys(state: HFEncoderState, i: int, k: Tensor | None) -> Tensor | None:
    """Layer ``i``'s key projection (b, K, H·dh) from what the hooks captured: the key
    linear's output, or the middle third of a fused q/k/v projection (ModernBERT's Wqkv)."""
    if k is None:
        return None
    q_lin, k_lin = state.qk[i]
    if q_lin is k_lin:
        return k.chunk(3, dim=-1)[1]
    return k


def _weights(soft: Tensor | None, size: Tensor | None) -> Tensor | None:
    """The keys' multiplicative weights in attention: soft masks (training) times sizes
    (merged tokens, proportional attention); None when both are."""
    if size is None:
        return soft
    return size if soft is None else soft * size


def _layer_mask(state: HFEncoderState, run: _Pass, hidden: Tensor, mask: Tensor,
                tokens: _Tokens):
    """The layers' mask after a gather: the stock helper's, or when merging the additive
    bias log(size) on real keys (proportional attention: a token of size s weighs as s
    copies of itself), which is also the call's ``soft_bias`` (DeBERTa reads it)."""
    if not run.merge:
        return _bidirectional(state, hidden, mask, skip=not run.sync_free)
    bias = _additive(mask, tokens.size, hidden.dtype)[:, None, None, :]
    run.call.soft_bias = bias
    return bias


def _follow(src: Tensor, dest: Tensor, index: Tensor, mask: Tensor) -> Tensor:
    """The source map after a merge and gather: ``src`` (b, L) each original position's slot
    before, ``dest`` (b, K) each slot's destination slot, ``index`` (b, K') the old slot of
    each new slot (``mask`` its real ones). Returns each original position's new slot (−1
    stays −1)."""
    b, K = dest.shape
    new = torch.zeros(b, K + 1, dtype=torch.long, device=dest.device)
    cols = torch.arange(index.shape[1], device=dest.device).expand_as(index)
    new.scatter_(1, index.masked_fill(~mask, K), cols)  # padding slots write the spare column
    new = torch.gather(new, 1, dest)  # (b, K): old slot → the new slot of its destination
    out = torch.gather(new, 1, src.clamp_min(0))
    return torch.where(src >= 0, out, src)


def _merged_outputs(index: Tensor, mask: Tensor, tokens: _Tokens, length: int
                    ) -> tuple[Tensor, Tensor]:
    """((b, L) float sizes at the kept original positions (0 elsewhere), (b, L) long source
    map: each original position's representative's original position, itself at padding)."""
    b = index.shape[0]
    size = mask.float() if tokens.size is None else tokens.size.float() * mask
    sizes = torch.zeros(b, length + 1, dtype=torch.float32, device=index.device)
    sizes.scatter_(1, index.masked_fill(~mask, length), size)
    pos = torch.arange(length, device=index.device).expand(b, length)
    src = tokens.src
    rep = torch.gather(index, 1, src.clamp_min(0))
    return sizes[:, :length], torch.where(src >= 0, rep, pos)


def _kept_positions(index: Tensor, mask: Tensor, length: int) -> Tensor:
    """(b, L) bool: the original positions of the real slots of ``index`` (b, K), i.e. the
    tokens the last layer computed. One scatter, no read-back: padding slots (whose index
    points at position 0) write into a spare column L, cut off after."""
    b = index.shape[0]
    out = torch.zeros(b, length + 1, dtype=torch.bool, device=index.device)
    out.scatter_(1, index.masked_fill(~mask, length), True)
    return out[:, :length]


def _width(run: _Pass, keep: Tensor, rho: float) -> int | None:
    """The gather's width K' (None: the batch's largest kept count, read back on the CPU
    path). Sync-free (:func:`sync_free`): ⌊ρ·K⌋ from the shape for a fixed-ratio method; a
    threshold method's largest count, read back once (eager) or as a data-dependent size
    (traced); an export always the data-dependent size (exactly the eager tokens)."""
    if run.exporting or (run.static and getattr(run.method, "variable_budget", False)):
        return _traced_width(keep)
    if not run.sync_free:
        return None
    if getattr(run.method, "variable_budget", False):
        return max(int(keep.sum(1).max()), 1)  # the documented one sync of a threshold layer
    return _fixed_width(keep.shape[1], rho, run.floor)


def _grouped(state: HFEncoderState, run: _Pass, start: int, groups: list[Tensor],
             hidden: Tensor, mask: Tensor, index: Tensor,
             full: Tensor | None, protect: Tensor | None = None,
             tokens: _Tokens | None = None
             ) -> tuple[Tensor, Tensor | None, Tensor, tuple | None]:
    """Layers ``start``, … on each group of rows, cut to the group's longest row (pad slots sit
    at the end of a gathered row), then the groups' outputs back in the rows' places.

    ``output="scatter"``: the (b, L, d) final states, row by row as one batch would give them.
    ``output="short"``: (b, K', d) with K' the longest final row over all groups (as one batch
    gives); slots past a group's own width are zeros (they are padding, mask False).
    """
    call = run.call
    tokens = tokens or _Tokens()
    t0 = time.perf_counter()
    parts = []
    for rows in groups:  # rows (g,) indices into the b rows
        k = max(int(mask[rows].sum(1).max()), 1)
        h, m = hidden[rows, :k], mask[rows, :k]  # (g, k, d), (g, k)
        sub = tokens.rows(rows, k)
        m4 = _layer_mask(state, run, h, m, sub)
        sub_full = None if full is None else full[rows]  # (g, L, d)
        call.gather_time_s += time.perf_counter() - t0
        prot = None if protect is None else protect[rows, :k]
        parts.append((rows, _layers(state, run, start, h, m, m4, index[rows, :k], sub_full,
                                    gathered=True, protect=prot, tokens=sub)))
        t0 = time.perf_counter()
    kept = mask.new_zeros(hidden.shape[0], run.length)
    for rows, (_, _, k, _) in parts:
        kept[rows] = k
    merged = None
    if run.merge:
        sizes = torch.zeros(hidden.shape[0], run.length, device=mask.device)
        source = torch.zeros(hidden.shape[0], run.length, dtype=torch.long, device=mask.device)
        for rows, (_, _, _, (sz, sc)) in parts:
            sizes[rows], source[rows] = sz, sc
        merged = (sizes, source)
    if full is not None:
        out = torch.empty_like(full)  # the groups cover every row once
        for rows, (o, _, _, _) in parts:
            out[rows] = o
        call.gather_time_s += time.perf_counter() - t0
        return out, None, kept, merged
    b, d = hidden.shape[0], hidden.shape[-1]
    width = max(o.shape[1] for _, (o, _, _, _) in parts)
    out = hidden.new_zeros(b, width, d)
    out_mask = mask.new_zeros(b, width)
    for rows, (o, m, _, _) in parts:
        out[rows, : o.shape[1]] = o
        out_mask[rows, : m.shape[1]] = m
    call.gather_time_s += time.perf_counter() - t0
    return out, out_mask, kept, merged


def _tracing() -> bool:
    """True while torch.export / torch.compile / the TorchScript tracer records the forward.

    Python must not branch on values there: the loop skips the per-forward statistics, timers
    and row bucketing (counts read back from tensors) and sizes every gather from shapes
    (:func:`_fixed_width`) or, exporting, by :func:`_traced_width` (a symbolic size)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


# torch.export sets this module flag for the whole trace (``torch._export.utils.
# _compiling_state_context``, strict and non-strict, so ONNX's dynamo exporter too); plain
# torch.compile never does. Absent on torches older than 2.6, which only have the function.
_EXPORT_FLAG = hasattr(torch.compiler, "_is_exporting_flag")


def _exporting() -> bool:
    """torch.export / ONNX (dynamo) / the TorchScript tracer: graphs meant to run without
    Python, whose gathers keep the eager forward's exact widths (:func:`_traced_width`).

    Reads ``torch.compiler._is_exporting_flag`` itself, not ``torch.compiler.is_exporting()``:
    up to torch 2.11 dynamo answers a traced ``is_exporting()`` with a constant True inside
    any compiled function (pytorch#176347, fixed by #176499), which took the export path's
    ``.item()`` under plain ``torch.compile``: graph breaks, host syncs, split CUDA graphs.
    Dynamo reads a module attribute as it is (a guarded constant), so the flag is False under
    torch.compile and True under torch.export on every torch (tests/test_export_flag.py)."""
    if torch.jit.is_tracing():
        return True
    if _EXPORT_FLAG:
        return bool(torch.compiler._is_exporting_flag)
    return torch.compiler.is_exporting()


def _traced_width(keep: Tensor):
    """The gather width K of an exported forward: the batch's largest kept count (CLS and
    separators included), as a data-dependent size, at least 2.

    ``.item()`` under torch.export gives an unbacked SymInt, which ONNX carries as a tensor
    (the Slice that cuts the sorted positions), so the graph keeps exactly the tokens the eager
    forward keeps, for fixed budgets and thresholds alike. At least 2 because HF's SDPA call
    branches on ``q_length > 1``, a guard an unbacked size cannot answer; a batch whose rows
    all keep one token gets one padding slot, masked like any other."""
    width = keep.shape[1]
    k = keep.sum(1).max().clamp(2, width).item()
    size_hint(k >= 2)
    size_hint(k <= width)
    return k


def _bidirectional(state: HFEncoderState, hidden: Tensor, mask: Tensor, skip: bool = True):
    """The layers' attention mask for a gathered batch, from the stock helper: the format the
    model's attention implementation expects (None, bool or float). ``skip=False`` always
    builds the mask: the helper's "no padding, no mask" shortcut reads the mask back from
    the device (``mask.all()``), which the sync-free path must not do."""
    from attnprune.compat import create_bidirectional_mask

    extra = {} if skip else {"allow_is_bidirectional_skip": False}
    return create_bidirectional_mask(config=state.config, inputs_embeds=hidden,
                                     attention_mask=None if mask is None else mask.long(),
                                     **extra)


def _additive(mask: Tensor, soft: Tensor | None, dtype) -> Tensor:
    """(B, L) additive key bias: log m̃ on real keys (0 when no soft mask), dtype-min on padding."""
    lo = torch.finfo(dtype).min
    if soft is None:
        return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device),
                           torch.full((), lo, dtype=dtype, device=mask.device))
    # clamp: log 0 = −inf would give NaN gradients; e^-30 is already "removed". In float32:
    # e^-30 underflows to 0 in fp16 (smallest subnormal 6e-8), so the log is taken in fp32
    # and the result (−30) fits every dtype.
    return torch.where(mask, soft.float().clamp_min(math.exp(-30)).log().to(dtype),
                       torch.full((), lo, dtype=dtype, device=mask.device))


# ----------------------------------------------------------------------------- the host
@register_host("hf_encoder", kinds=("token",), matches=lambda m: _family(m) is not None)
def patch_hf_encoder(model: nn.Module, spec, keep_ratio: float | Sequence[float] = 0.5,
                     after_layer: int = 1, schedule=None, output: str = "auto",
                     soft_mode: str = "bias", scorer_queries: int = 0,
                     bucket_rows: bool = True, protect_token_ids: Sequence[int] | None = None,
                     sync_free: bool | None = None, scorer_kernel: str = "matmul",
                     reduce: str | None = None, min_tokens: int | None = None,
                     **method_options) -> HFEncoderState:
    """Patch an encoder of a family in ``hf_attention.FAMILIES`` with a ``token`` anatomy (BERT,
    MiniLM, RoBERTa, DistilBERT, XLM-R, CamemBERT, ELECTRA, ALBERT, MPNet, DeBERTa-v2/v3,
    ModernBERT; or its ``*ForSequenceClassification``) with token method ``spec``.

    ``keep_ratio`` ρ, ``after_layer`` and ``schedule`` go through :func:`parse_schedule`;
    ``output`` ∈ {"auto", "scatter", "short"} ("auto", default: "short" for the
    ``*ForSequenceClassification`` models, whose heads read only position 0 and never return
    the encoder's states, "scatter" otherwise: :func:`_auto_output`); ``soft_mode`` ∈ {"bias", "multiply"} (training only);
    ``scorer_queries`` S > 0 estimates attention received from S evenly spaced query rows
    (0 = exact, all rows; costs one extra L×L attention at the pruning layer);
    ``bucket_rows`` (default True): at inference, after a gather, run the later layers on
    groups of rows with similar kept counts (:func:`attnprune.selection.row_groups`), each cut
    to its own longest row; same outputs, fewer padded slots. ``protect_token_ids``: token ids
    every selection keeps like CLS, e.g. the tokenizer's ``sep_token_id`` (default: the
    config's ``sep_token_id`` / ``eos_token_id`` / ``bos_token_id`` where set, e.g. RoBERTa's
    ``<s>`` and ``</s>``); the last real token and each ``token_type_ids`` segment's last token
    are kept whatever the ids (:func:`attnprune.methods.base.protect_special`).
    ``sync_free`` (default None: by device, True off the CPU): the forward that never reads
    the device, fixed gather widths, no row groups (:func:`sync_free`). ``scorer_kernel``:
    how the exact attention-received scorer runs at inference: "matmul" (default: the scores,
    then their softmax, in blocks) or "sdpa" (two fused attention passes from the rows'
    log-sum-exps: the L×L probabilities never exist;
    :func:`attnprune.attention.received_fused`).
    ``reduce``: what happens to the tokens a selection does not keep: "drop" (removed with
    their content) or "merge" (each averaged, weighted by sizes, into the kept token the
    method matched it with or else its most similar kept one by cosine of the layer's keys;
    later layers use proportional attention, log size on a merged key's logits; the output
    carries ``sizes`` and a ``source`` map, and with ``output="scatter"`` every position holds
    its representative's state: :func:`attnprune.selection.merge_tokens`); None (default):
    the method's ``default_reduce`` ("merge" for tome, "drop" for the others).
    ``min_tokens`` (default 0): rows with fewer real tokens than this are not reduced at all
    (short texts, queries; a patched SentenceTransformer that merges defaults to
    ``MERGE_MIN_TOKENS``). The rest are the method's options. All are checked before the
    model is touched.
    """
    if scorer_kernel not in SCORER_KERNELS:
        raise ValueError(f"scorer_kernel must be one of {SCORER_KERNELS}, got {scorer_kernel!r}")
    if sync_free is not None and not isinstance(sync_free, bool):
        raise ValueError(f"sync_free must be True, False or None (by device), got {sync_free!r}")
    check_attn_implementation(model.config, "hf_encoder")
    if not isinstance(bucket_rows, bool):
        raise ValueError(f"bucket_rows must be True or False, got {bucket_rows!r}")  # noqa: TRY004 (patch() contract: ValueError)
    if output not in ("auto", "scatter", "short"):
        raise ValueError(f"output must be 'auto', 'scatter' or 'short', got {output!r}")
    if isinstance(scorer_queries, bool) or not isinstance(scorer_queries, int) or scorer_queries < 0:
        raise ValueError(f"scorer_queries must be an integer ≥ 0, got {scorer_queries!r}")
    if soft_mode not in ("bias", "multiply"):
        raise ValueError(f"soft_mode must be 'bias' or 'multiply', got {soft_mode!r}")
    if reduce is None:
        reduce = getattr(registry.get(spec.name).cls, "default_reduce", "drop")
    if reduce not in REDUCE:
        raise ValueError(f"reduce must be one of {REDUCE}, got {reduce!r}")
    if min_tokens is None:
        min_tokens = 0
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise ValueError(f"min_tokens must be an integer ≥ 0, got {min_tokens!r}")
    protect_ids = _protect_ids(model.config, protect_token_ids)
    family, encoder, layers, qk = _anatomy(model)
    if output == "auto":
        output = _auto_output(model)
    cfg = model.config
    n_layers = len(layers)
    sched = parse_schedule(keep_ratio, n_layers, after_layer, schedule)
    d_model = getattr(cfg, "hidden_size", None) or cfg.dim
    n_heads = getattr(cfg, "num_attention_heads", None) or cfg.n_heads
    n_classes = max(int(getattr(cfg, "num_labels", 2) or 2), 2)
    context = {"d_model": d_model, "n_classes": n_classes, "n_layers": n_layers, "n_heads": n_heads}
    method = registry.create(spec.name, context=context, **method_options)
    param = next(model.parameters(), None)
    if param is not None:
        method.to(device=param.device, dtype=param.dtype)
    method.train(model.training)  # follow the model's mode (model.eval() came before the patch)
    rho = keep_ratio if isinstance(keep_ratio, (int, float)) else min(sched)
    state = HFEncoderState(spec.name, method, encoder, layers, qk, sched, float(rho), cfg,
                           family, output, soft_mode, bucket_rows, sync_free)
    state.n_heads = n_heads
    state.scorer_queries = scorer_queries
    state.scorer_kernel = scorer_kernel
    state.protect_ids = protect_ids
    state.reduce = reduce
    state.min_tokens = min_tokens
    from attnprune.compat import (
        BaseModelOutput,
        BaseModelOutputWithPastAndCrossAttentions,
    )

    state.output_cls = BaseModelOutputWithPastAndCrossAttentions if family == "bert" else BaseModelOutput
    add_method_module(model, method)  # trained and saved with the model
    if method.needs_attention or getattr(method, "needs_keys", False) or reduce == "merge":
        for q_lin, k_lin in dict.fromkeys(qk):  # once per module (ALBERT shares them)
            state._handles.append(q_lin.register_forward_hook(partial(_capture, state, "q", q_lin)))
            state._handles.append(k_lin.register_forward_hook(partial(_capture, state, "k", q_lin)))
    # Hooks and the forward are partials over the state (``replace_forward``): deep copies of
    # the model get their own. The kept mask's hook first: it runs before the call ends.
    state._handles.append(model.register_forward_hook(partial(_attach_kept_mask, state),
                                                      with_kwargs=True))
    state._handles += bracket_calls(model, state, state.calls, _begin_call)
    replace_forward(encoder, _encoder_forward, state)
    return state


def _begin_call(state: HFEncoderState, call: _Call, module, args, kwargs) -> None:
    """A forward of the model begins (``bracket_calls``): its labels (for methods that read
    them), its token ids and segment ids (to find the separators: the encoder sees only
    embeddings) and the rank loss set for it; refuses output flags the pruned loop cannot
    honour."""
    if state.enabled and any(r < 1.0 for r in state.schedule):
        refuse_output_flags(module.config, kwargs, "hf_encoder")
    ids = kwargs.get("input_ids", args[0] if args else None)
    call.labels = kwargs.get("labels")
    call.inputs = (ids if isinstance(ids, Tensor) else None, kwargs.get("token_type_ids"))
    if state._rank:
        call.rank = state._rank.pop(threading.get_ident(), None)  # the next forward only


def _attach_kept_mask(state: HFEncoderState, module, args, kwargs, output) -> None:
    """Forward hook on the model: puts this call's kept mask on its output (``.kept_mask``,
    an attribute, not a key: the output's tuple form and its keys stay the stock ones). A
    forward that ran no pruned loop (``enabled = False``, ModernBERT's stock path) keeps
    every real token: the mask is then the caller's padding mask."""
    call = state.calls.current()
    kept = call.kept_mask
    if kept is None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        given = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        ref = ids if isinstance(ids, Tensor) else embeds
        if isinstance(given, Tensor) and given.dim() == 2:
            kept = given.bool()
        elif isinstance(ref, Tensor) and given is None:
            kept = torch.ones(ref.shape[:2], dtype=torch.bool, device=ref.device)
        call.kept_mask = kept
    if kept is not None and isinstance(output, ModelOutput):
        object.__setattr__(output, "kept_mask", kept)
        if call.sizes is not None:
            object.__setattr__(output, "sizes", call.sizes)
            object.__setattr__(output, "source", call.source)


def _protect_ids(config, ids: Sequence[int] | None) -> tuple[int, ...]:
    """``protect_token_ids`` checked, or the config's separator-like ids (never padding)."""
    if ids is None:
        pad = getattr(config, "pad_token_id", None)
        found = {getattr(config, k, None) for k in ("sep_token_id", "eos_token_id", "bos_token_id")}
        return tuple(sorted(int(i) for i in found if isinstance(i, int) and i != pad))
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"protect_token_ids must be a list of token ids (integers ≥ 0), got {ids!r}")
    return tuple(sorted(set(ids)))


def _auto_output(model: nn.Module) -> str:
    """"short" when the model's head reads only position 0 of the encoder output (CLS, kept
    at position 0 by every gather) and its output has no per-token states: BERT's pooler,
    RoBERTa's classification head and DistilBERT's pre-classifier all read ``hidden[:, 0]``,
    and ``SequenceClassifierOutput`` does not return ``last_hidden_state``. Scattering the
    kept tokens back to (B, L, d) would then be two (B, L, d) copies nobody reads. Any other
    model (the bare encoder, token classification, ...) gets "scatter", the stock shape.
    The heads are the family's ``cls_head`` in ``hf_attention.FAMILIES``."""
    from attnprune.hosts.hf_attention import family

    # exact types: a subclass may read other positions
    return "short" if type(model).__name__ in family(model).cls_head else "scatter"


def _capture(state: HFEncoderState, name: str, owner_q: nn.Module, module, args, output) -> None:
    """Forward hook storing the output of a query/key linear in the running call when its
    layer is being scored (the call of the thread that runs the forward)."""
    if state.enabled:
        call = state.calls.current()
        if call.want is owner_q:
            call.captured[name] = output
