"""Token pruning inside stock Hugging Face encoders: BERT (and MiniLM), RoBERTa, DistilBERT,
XLM-R, CamemBERT, ELECTRA, ALBERT, MPNet, DeBERTa-v2/v3, ModernBERT (what differs between
them: the family table and the anatomies of ``hf_encoder_families``; the table of what is
tested: ``docs/families.md``).

The host wraps only the encoder loop (``BertEncoder.forward`` / ``Transformer.forward``): the
stock layers, embeddings, pooler and heads run unchanged. After the layers named by the
schedule (:func:`attnprune.selection.parse_schedule`), a registered token method scores the
tokens and the host removes the dropped ones from the tensor (gather) before the next layer:

    X⁽⁰⁾ = embeddings                                           (B, L, d)
    X⁽ˡ⁾ = layer_l(X⁽ˡ⁻¹⁾, mask⁽ˡ⁻¹⁾)                            (B, K_l, d)
    after layer l with r_l < r_{l−1}:  keep = method(X⁽ˡ⁾, A⁽ˡ⁾, ρ_l = r_l / r_{l−1})
    X⁽ˡ⁾ ← gather(X⁽ˡ⁾, keep)                                   (B, K_{l+1}, d)

Notation: B batch, L length, d width, H heads, r_l the cumulative keep ratio after layer l
(share of the original real tokens), ρ keep ratio, A⁽ˡ⁾ the attention probabilities of layer
l, m̃ a relaxed (soft) keep mask.

The host by job: this module patches the model (state, hooks, the encoder's forward, per-call
data); :mod:`~attnprune.hosts.hf_encoder_loop` runs the layers, the selections, gathers,
merging and the row-group recursion; :mod:`~attnprune.hosts.hf_encoder_paths` picks the path
by device or tracing and keeps the statistics; the scorer's attention math is
:func:`attnprune.attention.scorer_attention`. What the choices below cost and saved, measured:
``docs/encoder.md`` ("Where the encoder host's time goes").

Choices, and why:
* Kept counts that differ per row are padded to the batch maximum with a mask
  (``selection.gather_tokens``), not packed: the stock layers and SDPA take a padded batch and
  a key mask; packing needs varlen kernels that CPU SDPA lacks.
* Row bucketing (inference, CPU path, ``bucket_rows=True``): after a gather, rows of similar
  kept counts run the later layers as groups, each cut to its own longest row
  (:func:`attnprune.selection.row_groups`, c = :func:`group_overhead_tokens` slots per group
  and layer). Padding never attends nor is attended: the same outputs up to rounding. Training
  keeps one padded batch (soft masks and batch losses see the whole batch).
* CLS (position 0) and every separator are always kept (``protect_first``,
  ``protect_special``, ``protect_token_ids``); the gather keeps ascending order, so every stock
  head reads CLS at position 0 and a sentence pair keeps the boundary between its texts.
* The output is scattered back to (B, L, d) (``output="scatter"``) so the shape is the stock
  one; ``output="short"`` (the default for the CLS-reading ``*ForSequenceClassification``
  heads) skips that copy. Either way the call's kept mask (``state.kept_mask`` per thread,
  ``output.kept_mask``) marks the positions the last layer computed.
* The scorer's attention is computed only at pruning layers, from the q/k projections the
  layer already computed (forward hooks on the query/key linears), and only for the rows the
  method reads (``attention_rows``); the model keeps its own attention implementation.
* Training: a method's soft mask enters the later layers as an additive log-mask bias on the
  keys (``soft_mode="bias"``: at m̃_j = 0 the same as removing key j) or multiplies the states
  (``"multiply"``); in eval every method is hard and gathers.
* One row without padding (batch-1 serving) takes a short path: no masks, one
  ``index_select`` per gather.
* Traced (``torch.export`` / ONNX / ``torch.compile``): every gather is as wide as the batch's
  largest kept count, a data-dependent size, so an exported graph keeps exactly the eager
  forward's tokens; statistics and row bucketing, which read counts back, are skipped.
* ``position_ids`` given to the model are not passed to layers after a gather (HF_NOTES.md:
  non-consecutive ids look like packed sequences).

Written by hand: no library prunes tokens inside the stock HF encoder loop, nor buckets the rows
of a batch whose lengths change between its layers.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor, nn

from attnprune import hosts as kit  # the hosts' shared kit: per-call state, patching
from attnprune.attention import SCORER_KERNELS
from attnprune.compat import ModelOutput
from attnprune.hosts.families import family
from attnprune.hosts.hf_encoder_loop import Pass, Tokens, bidirectional_mask, run_layers
from attnprune.hosts.hf_encoder_paths import (
    LazyStats,
    exporting,
    forward_stats,
    sync_free,
    tracing,
    warn_cut,
)
from attnprune.methods import registry
from attnprune.methods.base import protect_special
from attnprune.selection import parse_schedule

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
    return kit.group_overhead(GROUP_OVERHEAD_TOKENS, d_model, "encoder")


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
class _Call(kit.CallData):
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
        # set_rank_loss: the rank loss waiting for the thread's next forward, held by its last
        # finished call (``HFEncoderState.next_rank``) until that forward takes it
        self.next_rank: Callable[[Tensor, Tensor], Tensor] | None = None
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


class HFEncoderState(kit.CallState):
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
                 sync_free: bool | None = None, *, n_heads: int = 0, scorer_queries: int = 0,
                 scorer_kernel: str = "matmul", protect_ids: tuple[int, ...] = (),
                 reduce: str = "drop", min_tokens: int = 0, output_cls=None) -> None:
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
        self.n_heads = n_heads
        self.scorer_queries = scorer_queries  # S query rows for "received" (0: all, exact)
        self.scorer_kernel = scorer_kernel
        self.protect_ids = protect_ids  # token ids kept like CLS (separators)
        self.reduce = reduce
        self.min_tokens = min_tokens
        self.output_cls = output_cls  # the encoder's output class
        self._protect_tensors: dict = {}  # protect_ids as a tensor per device (no copy per call)
        self._handles: list = []

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
    # (aux_losses and stats: CallState's)
    call_data = _Call
    kept_mask = kit.LastCall(
        """(B, L) bool of the last forward on this thread: True at the positions the last
        layer computed (the kept tokens: their states in ``last_hidden_state`` are the pruned
        model's output); False at padding and at dropped tokens, whose scattered states are
        the ones of the layer that dropped them. Every real token at keep ratio 1 or with
        ``enabled = False``. The model's output carries the same tensor as ``.kept_mask``
        (a ``ModelOutput``; not with ``return_dict=False``). None before any forward.
        Per thread: two threads serving one model each read their own call's.""")

    sizes = kit.LastCall(
        """(B, L) float32 of the last forward on this thread when merging (``reduce="merge"``):
        at each kept position (``kept_mask``) how many original tokens it stands for (its own
        and those merged into it), 0 elsewhere; a row sums to its real tokens. None when the
        patch drops tokens. Also ``output.sizes``.""")
    source = kit.LastCall(
        """(B, L) long of the last forward on this thread when merging: for every original
        position the original position of its representative (the kept token it was merged
        into, itself when kept, itself at padding). With ``output="scatter"`` the output at
        position p is the representative's state, ``last_hidden_state[b, source[b, p]]``.
        None when the patch drops tokens. Also ``output.source``.""")
    next_rank = kit.LastCall(
        """The rank loss :meth:`set_rank_loss` set for this thread's next forward (None: none),
        held by the thread's last finished call until the next forward begins and takes it.""")

    def set_rank_loss(self, loss: Callable[[Tensor, Tensor], Tensor] | None) -> None:
        """``loss(student (B, L), mask) -> Tensor`` for the calling thread's next forward
        only, in training: added to its ``aux_losses`` at the first pruning layer, on the
        scorer's token distribution there (ranking distillation,
        :mod:`attnprune.train.rank_distill`). None withdraws it."""
        self.next_rank = loss

    def mask4d(self, hidden: Tensor, attention_mask: Tensor):
        """The layers' mask for the uncut batch from a (B, L) padding mask, for a family's
        ``forward``: the stock helper, without its "no padding, no mask" shortcut on the
        sync-free path (the shortcut reads the mask back: ``mask.all()``)."""
        return bidirectional_mask(self, hidden, attention_mask,
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
        return {**self.__dict__, "_protect_tensors": {}}

    def unpatch(self, model: nn.Module) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        kit.remove_state_hooks(model, self)
        kit.restore_forward(self.encoder)
        kit.remove_method_module(model, self.modules)




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
            _keep_rank_waiting(calls, call)
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
    kit.check_attn_implementation(state.config, "hf_encoder")
    kwargs.pop("encoder_attention_mask", None)
    kwargs.pop("past_key_values", None)
    kwargs.pop("cache", None)  # the cache's name from transformers 5.24 on
    kwargs.pop("use_cache", None)
    training = state.encoder.training
    B, L, _ = hidden_states.shape
    mask = _key_mask(attention_mask, B, L, hidden_states.device)  # (B, L) real tokens
    static = tracing()
    free = sync_free(hidden_states.device, state.sync_free)
    n = len(state.layers)
    method = state.modules
    # Row bucketing at inference on the CPU path only: training keeps one padded batch (soft
    # masks, and losses over the batch); the sync-free path never reads counts back.
    merge = getattr(state, "reduce", "drop") == "merge"
    run = Pass(call=call, method=method, training=training,
               rows=getattr(method, "attention_rows", "all"),
               labels=call.labels if training else None, kwargs=kwargs,
               bucket=state.bucket_rows and not training and not free, static=static,
               sync_free=free, exporting=exporting(),
               kept=[0.0] * n, padded=[0] * n, length=L, merge=merge,
               floor=getattr(state, "min_tokens", 0), overhead=group_overhead_tokens)
    index = torch.arange(L, device=mask.device).expand(B, L)  # original positions
    full = hidden_states if state.output == "scatter" else None
    ids, token_types = call.inputs or (None, None)
    special = state.protect_tensor(mask.device) if ids is not None else None
    protect = protect_special(mask, ids, token_types, () if special is None else special)
    # merging: every original position's current slot (−1 at padding), read at the end to
    # give each position its representative's state (the source map)
    tokens = Tokens(
        size=None,
        src=torch.where(mask, index, torch.full((), -1, dtype=index.dtype, device=mask.device))
        if merge else None,
        whole=(mask.sum(1) < run.floor) if run.floor > 0 else None)
    hidden_states, _, kept_mask, merged = run_layers(state, run, 0, hidden_states, mask,
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
        call.stats = LazyStats(lambda: warn_cut(state, forward_stats(kept, padded, real, n,
                                                                     times, cut)))
    else:
        call.stats = forward_stats(run.kept, run.padded, mask.sum(), n, times)
    return state.output_cls(last_hidden_state=hidden_states)


# ----------------------------------------------------------------------------- the host
@kit.register_host("hf_encoder", kinds=("token",), matches=lambda m: _family(m) is not None)
def patch_hf_encoder(model: nn.Module, spec, keep_ratio: float | Sequence[float] = 0.5,
                     after_layer: int = 1, schedule=None, output: str = "auto",
                     soft_mode: str = "bias", scorer_queries: int = 0,
                     bucket_rows: bool = True, protect_token_ids: Sequence[int] | None = None,
                     sync_free: bool | None = None, scorer_kernel: str = "matmul",
                     reduce: str | None = None, min_tokens: int | None = None,
                     **method_options) -> HFEncoderState:
    """Patch an encoder of a family in ``hosts.families.FAMILIES`` with a ``token`` anatomy (BERT,
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
    kit.check_attn_implementation(model.config, "hf_encoder")
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
    method = kit.build_method(spec.name, context, model, **method_options)
    rho = keep_ratio if isinstance(keep_ratio, (int, float)) else min(sched)
    from attnprune.compat import (
        BaseModelOutput,
        BaseModelOutputWithPastAndCrossAttentions,
    )

    state = HFEncoderState(
        spec.name, method, encoder, layers, qk, sched, float(rho), cfg, family, output,
        soft_mode, bucket_rows, sync_free, n_heads=n_heads, scorer_queries=scorer_queries,
        scorer_kernel=scorer_kernel, protect_ids=protect_ids, reduce=reduce,
        min_tokens=min_tokens,
        output_cls=BaseModelOutputWithPastAndCrossAttentions if family == "bert" else BaseModelOutput)
    kit.add_method_module(model, method)  # trained and saved with the model
    if method.needs_attention or getattr(method, "needs_keys", False) or reduce == "merge":
        for q_lin, k_lin in dict.fromkeys(qk):  # once per module (ALBERT shares them)
            state._handles.append(q_lin.register_forward_hook(partial(_capture, state, "q", q_lin)))
            state._handles.append(k_lin.register_forward_hook(partial(_capture, state, "k", q_lin)))
    # Hooks and the forward are partials over the state (``replace_forward``): deep copies of
    # the model get their own. The kept mask's hook first: it runs before the call ends.
    state._handles.append(model.register_forward_hook(partial(_attach_kept_mask, state),
                                                      with_kwargs=True))
    state._handles += kit.bracket_calls(model, state, state.calls, _begin_call)
    kit.replace_forward(encoder, _encoder_forward, state)
    return state


def _begin_call(state: HFEncoderState, call: _Call, module, args, kwargs) -> None:
    """A forward of the model begins (``bracket_calls``): its labels (for methods that read
    them), its token ids and segment ids (to find the separators: the encoder sees only
    embeddings) and the rank loss set for it; refuses output flags the pruned loop cannot
    honour."""
    if state.enabled and any(r < 1.0 for r in state.schedule):
        kit.refuse_output_flags(module.config, kwargs, "hf_encoder")
    ids = kwargs.get("input_ids", args[0] if args else None)
    call.labels = kwargs.get("labels")
    call.inputs = (ids if isinstance(ids, Tensor) else None, kwargs.get("token_type_ids"))
    prev = state.calls.last()  # the thread's last finished call holds a waiting rank loss
    if prev is not None and prev.next_rank is not None:
        call.rank, prev.next_rank = prev.next_rank, None  # the next forward only


def _attach_kept_mask(state: HFEncoderState, module, args, kwargs, output) -> None:
    """Forward hook on the model: puts this call's kept mask on its output (``.kept_mask``,
    an attribute, not a key: the output's tuple form and its keys stay the stock ones). A
    forward that ran no pruned loop (``enabled = False``, ModernBERT's stock path) keeps
    every real token: the mask is then the caller's padding mask."""
    call = state.calls.current()
    _keep_rank_waiting(state.calls, call)
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


def _keep_rank_waiting(calls: kit.Calls, ending: _Call) -> None:
    """A call that ends becomes the thread's last one: a rank loss still waiting on the call
    before it (set during this forward, or before a forward that took none) moves to it, so
    it waits for the thread's next forward whatever ran in between."""
    prev = calls.last()
    if prev is not None and prev is not ending and prev.next_rank is not None:
        ending.next_rank, prev.next_rank = prev.next_rank, None


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
    The heads are the family's ``cls_head`` in ``hosts.families.FAMILIES``."""
    # exact types: a subclass may read other positions
    return "short" if type(model).__name__ in family(model).cls_head else "scatter"


def _capture(state: HFEncoderState, name: str, owner_q: nn.Module, module, args, output) -> None:
    """Forward hook storing the output of a query/key linear in the running call when its
    layer is being scored (the call of the thread that runs the forward)."""
    if state.enabled:
        call = state.calls.current()
        if call.want is owner_q:
            call.captured[name] = output
