"""Hosts wire methods into model families (ToMe's ``patch/<host>.py``), and the kit they share.

A host module registers itself with :func:`register_host`: the method kinds it serves, a
predicate that recognises models it can patch, a ``patch(model, spec, **options)`` function
that returns a :class:`PatchState`, and what ``attnprune.patch`` must know of it without a
branch of its own (the options it takes out of ``**options``, the method names it reads
otherwise, why its models take no second method, the inner model whose host's options it
also takes). ``attnprune.patch`` picks the first host whose kind and predicate match. Every
module in this folder is imported by walking the package.

The kit every host uses: :class:`CallState` (per-call results, one :class:`Calls` per state),
:func:`build_method` (a method module from its spec, on the model's device, dtype and mode),
:func:`group_overhead` (row bucketing's cost of one more group, or the host's fixed override),
:func:`split_rows` / :func:`run_row_groups` (the row-group recursion's step),
:func:`replace_forward` / :func:`replace_method` / :func:`bracket_calls` /
:func:`add_method_module` (how a model is changed), :func:`patch_with` / :func:`unpatch_model` (the bookkeeping of a patch).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor, nn

from attnprune.compat import attn_implementation, children_dict, hook_dicts
from attnprune.methods import registry
from attnprune.selection import group_overhead_slots, row_groups

# The attribute of a patched model that holds its PatchState (``attnprune.patch_state``).
MODEL_STATE_ATTR = "_attnprune"


class PatchState:
    """What a patch leaves on the model (``model._attnprune``): how to undo it and how to
    read the auxiliary losses of the last forward.

    Hosts subclass it; ``aux_losses`` is a list that the host refills on every forward
    (cleared at the start of the forward), so the caller sees the losses of its last call.
    """

    def __init__(self, method: str, modules: nn.Module | None = None) -> None:
        self.method = method
        self.modules = modules  # the method's nn.Module(s), registered on the model
        self.aux_losses: list[torch.Tensor] = []
        self.stats: dict = {}  # per-forward statistics (kept counts per layer, ...)
        # set by ``attnprune.patch``: the name and options it was called with and the method's
        # kind (the recipe ``attnprune.save_pretrained`` writes and ``from_pretrained`` replays)
        self.requested: str = method
        self.options: dict = {}
        self.kind: str | None = None

    def unpatch(self, model: nn.Module) -> None:
        raise NotImplementedError

    def aux_loss(self) -> torch.Tensor | None:
        if not self.aux_losses:
            return None
        return torch.stack([a.reshape(()) for a in self.aux_losses]).sum()


class CallData:
    """Base of a host's per-call data: what one forward of a patched model computes and reads
    back within that forward (captured projections, masks, the layer running now), and what
    it leaves for its caller (``aux_losses``, ``stats``). Hosts subclass it with their fields."""

    def __init__(self) -> None:
        self.aux_losses: list[torch.Tensor] = []
        self.stats: dict = {}


class Calls:
    """The one per-call state of every host: a patch state's :class:`CallData`, per thread.

    :func:`bracket_calls` begins a call at the model's entry (a forward pre-hook) and ends it
    at the exit (an ``always_call`` forward hook: also when the forward raised), the
    ``try/finally`` of a forward the library does not own. Calls nest (a model run inside its
    own forward, by a hook or a teacher): each thread keeps a stack. ``current()`` is the
    running call's data; ``last()`` the thread's last finished call's, which its caller reads
    (losses, statistics) — one patched model serves several threads (a web server's pool) and
    no thread reads another's. A copy or pickle of the state starts with no calls.
    """

    def __init__(self, factory: Callable[[], CallData] = CallData) -> None:
        self.factory = factory
        self._local = threading.local()

    def _stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def begin(self) -> CallData:
        data = self.factory()
        self._local.loose = None
        self._stack().append(data)
        return data

    def end(self) -> None:
        stack = self._stack()
        if stack:
            self._local.last = stack.pop()

    def current(self) -> CallData:
        """The running call's data; outside a bracketed forward (a submodule called on its
        own), a loose call that the next :meth:`begin` replaces (never on the stack: it would
        look like a running call)."""
        stack = self._stack()
        if stack:
            return stack[-1]
        loose = getattr(self._local, "loose", None)
        if loose is None:
            loose = self._local.loose = self.factory()
        return loose

    def running(self) -> bool:
        return bool(self._stack())

    def last(self) -> CallData | None:
        """The data of this thread's last finished call (None before any)."""
        return getattr(self._local, "last", None)

    def __getstate__(self) -> dict:
        return {"factory": self.factory}

    def __setstate__(self, d: dict) -> None:
        self.factory = d["factory"]
        self._local = threading.local()


class LastCall:
    """A patch state's attribute that its caller reads back (``aux_losses``, ``stats``, a
    host's ``kept_mask``): the field of the calling thread's last finished call of
    ``state.calls``, the value a new call starts with before any. Setting it writes there
    (``PatchState.__init__``, a caller resetting ``stats``)."""

    def __init__(self, doc: str | None = None) -> None:
        self.__doc__ = doc

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, state, owner=None):
        if state is None:
            return self
        data = state.calls.last()
        return getattr(state.calls.factory() if data is None else data, self.name)

    def __set__(self, state, value) -> None:
        calls = state.calls
        if calls.last() is None:  # an empty finished call to hold it
            calls.begin()
            calls.end()
        setattr(calls.last(), self.name, value)


class CallState(PatchState):
    """A host's patch state whose per-call results live in ``calls``: ``aux_losses`` and
    ``stats`` (and any :class:`LastCall` a subclass adds) read the calling thread's last
    finished call, so threads sharing one patched model never read each other's. Subclasses
    name their :class:`CallData` class in ``call_data``."""

    call_data: type[CallData] = CallData
    aux_losses = LastCall("The auxiliary losses of this thread's last forward.")
    stats = LastCall("The statistics of this thread's last forward.")

    def __init__(self, method: str, modules: nn.Module | None = None) -> None:
        self.calls = Calls(self.call_data)  # first: PatchState's fields are per call
        super().__init__(method, modules)


class UntrainedMethodWarning(UserWarning):
    """A learned token method kept every token because its decisions are untrained."""


def bracket_calls(model: nn.Module, state: PatchState, calls: Calls,
                  on_begin: Callable | None = None) -> list:
    """Begin a call of ``calls`` at every forward of ``model`` and end it after, also when the
    forward raises; ``on_begin(state, data, module, args, kwargs)`` (a module-level function)
    fills the new call from the forward's arguments. Returns the two hook handles. The hooks
    are partials over ``state`` (see :func:`replace_forward`)."""
    return [
        model.register_forward_pre_hook(partial(_begin_call, state, calls, on_begin),
                                        with_kwargs=True, prepend=True),
        model.register_forward_hook(partial(_end_call, state, calls), always_call=True),
    ]


def _begin_call(state, calls: Calls, on_begin, module, args, kwargs) -> None:
    data = calls.begin()
    if on_begin is not None:
        on_begin(state, data, module, args, kwargs)


def _end_call(state, calls: Calls, module, args, output) -> None:
    calls.end()


def replace_method(module: nn.Module, name: str, fn: Callable, state: PatchState, *args) -> None:
    """The hosts' way to change what a module does: ``module.<name>`` becomes
    ``partial(fn, state, *args, <the module's stock bound method>)``, an instance attribute.

    A partial over a module-level function, not a closure nor a generated class:
    ``copy.deepcopy`` (which ``torch.ao`` quantization calls) copies a partial's arguments
    with the model's memo, so a copy's method reaches the copy's state and modules; pickle
    stores the function by name; the class stays the stock one (``isinstance``,
    ``save_pretrained`` and ``type(model).__name__`` are unchanged). :func:`restore_method`
    undoes it."""
    setattr(module, name, partial(fn, state, *args, getattr(module, name)))


def restore_method(module: nn.Module, name: str) -> None:
    """Undo :func:`replace_method` (the class's method shows through again)."""
    module.__dict__.pop(name, None)


def replace_forward(module: nn.Module, fn: Callable, state: PatchState, *args) -> None:
    """:func:`replace_method` on ``forward``: ``module.forward`` becomes
    ``partial(fn, state, *args, <the module's stock forward>)``."""
    replace_method(module, "forward", fn, state, *args)


def restore_forward(module: nn.Module) -> None:
    """Undo :func:`replace_forward` (the class's forward shows through again)."""
    restore_method(module, "forward")


def remove_state_hooks(model: nn.Module, state: PatchState) -> None:
    """Remove from every module of ``model`` the forward (pre-)hooks that are partials over
    ``state`` (how the hosts register them, so that deep copies get their own).

    The hosts' handles miss hooks that a module swap moved: ``torch.ao`` quantization's
    ``swap_module`` re-registers a Linear's hooks on its quantized replacement.
    """
    for m in model.modules():
        for hooks in hook_dicts(m):
            for key in [k for k, h in hooks.items()
                        if isinstance(h, partial) and any(a is state for a in h.args)]:
                del hooks[key]


# Attention back-ends the token hosts serve: both hand the layers a 4-D mask (bool or
# additive) that the hosts read and rebuild for the shortened batch; attnprune's own attention
# (hf_attention, registered with the SDPA mask) does too. flash_attention_2/3 take a 2-D mask
# or packed sequences, flex_attention a BlockMask: the gathered batch would need its own.
TOKEN_ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "attnprune_attention")


def check_attn_implementation(config, host: str) -> None:
    """ValueError naming the supported back-ends when the model's ``attn_implementation`` is
    one the token hosts cannot serve (checked at patch time and at every forward: it can be
    switched with ``set_attn_implementation`` after patching)."""
    impl = attn_implementation(config)
    if impl is not None and impl not in TOKEN_ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation: {host} token pruning supports "
            f"{', '.join(repr(i) for i in TOKEN_ATTN_IMPLEMENTATIONS[:2])} (and attnprune's own "
            f"attention methods), not {impl!r}; load the model with "
            f"attn_implementation=\"sdpa\" or call model.set_attn_implementation(\"sdpa\")")


def refuse_output_flags(config, kwargs: dict, host: str) -> None:
    """ValueError when a forward of a token-pruned model asks for ``output_hidden_states`` or
    ``output_attentions`` (in its arguments or its config): the layers after a pruning step
    run on fewer tokens, so per-layer states of varying widths (and no attentions from the
    fused kernel) would reach code that expects (B, L, d) tensors, wrong or crashing later.
    The message says how to get them: the unpruned forward."""
    for flag in ("output_hidden_states", "output_attentions"):
        value = kwargs.get(flag)
        if value is None:
            value = getattr(config, flag, False)
        if value:
            raise ValueError(
                f"{flag}: a token-pruned model ({host}) cannot return per-layer "
                f"{flag.removeprefix('output_')}: its later layers run on the kept tokens only. "
                f"Run that forward unpruned (attnprune.patch_state(model).enabled = False, or "
                f"attnprune.unpatch(model)); the pruned forward returns the last hidden state")


def build_method(name: str, context: dict, model: nn.Module, **options) -> nn.Module:
    """The method module ``name`` built with ``options`` and the model facts in ``context``
    (:func:`attnprune.methods.registry.create`), moved to ``model``'s device and dtype (a model
    loaded in bf16 and patched afterwards runs its method in bf16 too) and following its mode
    (``model.eval()`` came before the patch)."""
    method = registry.create(name, context=context, **options)
    param = next(model.parameters(), None)
    if param is not None:
        method.to(device=param.device, dtype=param.dtype)
    method.train(model.training)
    return method


def group_overhead(override: float | None, d_model: int, block: str) -> float:
    """Row bucketing's cost of one more group of rows, in token slots
    (:func:`attnprune.selection.row_groups`'s c): a host's fixed ``override`` if set (tests set
    a small one), else :func:`attnprune.selection.group_overhead_slots` at width ``d_model``."""
    return override if override is not None else group_overhead_slots(d_model, block=block)


def split_rows(mask: Tensor, overhead: float) -> list[Tensor] | None:
    """After a gather: the groups of rows (index tensors) with similar kept counts that run
    the rest of the layers apart, or None when one group (the batch) is best."""
    if mask.shape[0] < 2:
        return None
    groups = row_groups(mask.sum(1), overhead)
    return groups if len(groups) > 1 else None


def run_row_groups(groups: list[Tensor], mask: Tensor, run: Callable[[Tensor, int], object]
                   ) -> list[tuple[Tensor, object]]:
    """The row-group recursion's step: ``run(rows, k)`` on each group, ``rows`` its indices
    into the batch and ``k`` its longest row's count of ``mask``'s True slots (at least 1):
    the group is cut to its first ``k`` slots (pad slots sit at the end of a gathered row).
    Returns ``[(rows, what run returned)]``; the groups cover every row once."""
    return [(rows, run(rows, max(int(mask[rows].sum(1).max()), 1))) for rows in groups]


METHOD_MODULE = "attnprune_method"  # the submodule name a host gives the method module


def add_method_module(owner: nn.Module, module: nn.Module) -> str:
    """Register ``module`` on ``owner`` as ``attnprune_method`` (trained and saved with the
    model), or ``attnprune_method_2``, … when a stacked patch already holds that name (a token
    and an attention method on one BERT both live on the top model). Returns the name."""
    name, i = METHOD_MODULE, 2
    while name in children_dict(owner):
        name, i = f"{METHOD_MODULE}_{i}", i + 1
    owner.add_module(name, module)
    return name


def remove_method_module(owner: nn.Module, module: nn.Module) -> None:
    """Remove ``module`` from ``owner``'s submodules, whatever name it got (identity, so a
    stacked patch's unpatch never removes the other patch's method)."""
    children = children_dict(owner)
    for name in [n for n, m in children.items() if m is module]:
        del children[name]


@dataclass(frozen=True)
class Host:
    """A registered host: ``patch(model, spec, **options)`` for models ``matches`` accepts
    and methods of ``kinds``, and what :func:`attnprune.patch` must know of it."""

    name: str
    kinds: tuple[str, ...]
    matches: Callable[[nn.Module], bool]
    patch: Callable[..., PatchState]
    options: tuple[str, ...] = ()  # keywords its patch takes out of **options itself
    aliases: Mapping[str, str] = field(default_factory=dict)  # method names it reads otherwise
    one_method: str | None = None  # why its models refuse stack=True (None: they take it)
    # A wrapper host (sentence-transformers): the inner model it patches through that model's
    # host, whose options it takes too, and the name its own options go under in messages.
    inner: Callable[[nn.Module], nn.Module | None] | None = None
    label: str = ""

    def accepted(self, model: nn.Module, spec) -> tuple[str, list] | None:
        """(the method name this host builds for ``spec``, [(whose, option names)]) for
        :func:`attnprune.patch`'s check of its keywords; None when the host's patch says what
        is wrong with the model instead."""
        if self.inner is not None:
            inner = self.inner(model)
            try:
                found = None if inner is None else find_host(inner, spec.kind).accepted(inner, spec)
            except ValueError:
                return None  # the host's own check says why
            return None if found is None else (found[0], [*found[1], (self.label, self.options)])
        params = list(inspect.signature(self.patch).parameters.values())[2:]
        named = [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                      inspect.Parameter.KEYWORD_ONLY)]
        return (self.aliases.get(spec.name, spec.name),
                [(f"the {self.name} host", (*named, *self.options))])


_HOSTS: list[Host] = []


def register_host(name: str, kinds: tuple[str, ...], matches: Callable[[nn.Module], bool],
                  **declared):
    """Decorator on a host's ``patch`` function; ``declared``: :class:`Host`'s other fields
    (``options``, ``aliases``, ``one_method``, ``inner``, ``label``)."""

    def deco(fn):
        _HOSTS.append(Host(name, tuple(kinds), matches, fn, **declared))
        return fn

    return deco


def patch_with(host: Host, model: nn.Module, spec, requested: str, options: dict) -> PatchState:
    """``host.patch(model, spec, **options)`` with what every patch records on its state: the
    name and options it was called with (a copy: the host may consume its dict, the caller
    may change theirs) and the method's kind, the recipe ``attnprune.save_pretrained`` writes."""
    try:
        kept = copy.deepcopy(options)
    except Exception:  # noqa: BLE001 (any uncopyable option; save_pretrained refuses it by name)
        kept = dict(options)
    state = host.patch(model, spec, **options)
    state.requested, state.options, state.kind = requested, kept, spec.kind
    return state


def unpatch_model(model: nn.Module) -> None:
    """Undo the patch whose state ``model`` holds (a no-op on an unpatched model)."""
    state: PatchState | None = getattr(model, MODEL_STATE_ATTR, None)
    if state is not None:
        state.unpatch(model)
        object.__setattr__(model, MODEL_STATE_ATTR, None)


def _from_transformers(model: nn.Module) -> bool:
    return any(c.__module__.startswith("transformers.") for c in type(model).__mro__)


def _load_all(model: nn.Module | None = None) -> None:
    """Import the host modules. The ``hf_*`` hosts import model code from transformers (about
    3 s the first time), so they are skipped for a model that is not a transformers class."""
    skip_hf = model is not None and not _from_transformers(model)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or (skip_hf and info.name.startswith("hf_")):
            continue
        importlib.import_module(f"{__name__}.{info.name}")


def find_host(model: nn.Module, kind: str) -> Host:
    """The host that patches ``model`` for methods of ``kind``; ValueError if none does."""
    _load_all(model)
    for attempt in range(2):
        for host in _HOSTS:
            if kind in host.kinds and host.matches(model):
                return host
        if attempt == 0:
            _load_all()  # no match among the hosts loaded so far: try every host, then fail
    served = sorted({h.name for h in _HOSTS if kind in h.kinds})
    raise ValueError(
        f"model: no host patches {type(model).__name__} for {kind!r} methods "
        f"(hosts for {kind!r}: {', '.join(served) or 'none'})"
    )
