"""Method registry: one file per method registers itself by name (timm's ``register_model``).

A method is a small ``nn.Module`` class decorated with ``@register(name, kind=...)``.
``kind`` says where it acts, and so which host wires it in:

    "token"      between layers: scores tokens, the host drops the unkept ones
    "attention"  inside attention: an attention function (masks or scales scores)
    "loss"       in the loss: an auxiliary penalty collected with hooks

Adding a method never edits a central if/elif chain: the method modules are imported by
``attnprune.methods`` (a list of module names), and each registers itself.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from attnprune.methods.base import AttentionMethod, LossMethod, TokenMethod

KINDS = ("token", "attention", "loss")
_BASES = {"token": TokenMethod, "attention": AttentionMethod, "loss": LossMethod}


@dataclass(frozen=True)
class MethodSpec:
    name: str
    kind: str
    cls: type
    summary: str
    paper: str


_REGISTRY: dict[str, MethodSpec] = {}


def register(name: str, kind: str, paper: str = ""):
    """Class decorator: register ``cls`` under ``name``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def deco(cls):
        base = _BASES[kind]
        if not issubclass(cls, base):
            raise TypeError(f"method {name!r}: a {kind} method derives from "
                            f"attnprune.methods.base.{base.__name__} (the attributes hosts read)")
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise ValueError(f"method {name!r} is already registered by {_REGISTRY[name].cls}")
        doc = (inspect.getdoc(cls) or "").strip().splitlines()
        _REGISTRY[name] = MethodSpec(name, kind, cls, doc[0] if doc else "", paper)
        return cls

    return deco


def _load_all() -> None:
    importlib.import_module("attnprune.methods")


def list_methods(kind: str | None = None) -> list[str]:
    """Registered method names (optionally of one kind), sorted."""
    _load_all()
    return sorted(n for n, s in _REGISTRY.items() if kind is None or s.kind == kind)


def get(name: str) -> MethodSpec:
    """The spec of a registered method; an unknown name raises ValueError listing the known."""
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"method: unknown method {name!r}; known methods: {', '.join(sorted(_REGISTRY))}"
        ) from None


def option_names(name: str) -> tuple[str, ...] | None:
    """The keyword options method ``name``'s ``__init__`` takes, in order; None when it takes
    any (``**kwargs``)."""
    params = inspect.signature(get(name).cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return tuple(p for p in params if p != "self")


def check_options(name: str, options: Iterable[str],
                  also: Sequence[tuple[str, Sequence[str]]] = ()) -> None:
    """Raise ValueError when an option in ``options`` is neither method ``name``'s nor in
    ``also`` (``(whose, names)`` groups: the host's, ``patch``'s own). The message names each
    unknown option with the close accepted names (difflib) and lists every accepted name, so
    ``keep_ration=0.5`` reads "did you mean 'keep_ratio'?". A method that takes ``**kwargs``
    accepts anything."""
    own = option_names(name)
    if own is None:
        return
    groups = [(name, own), *((whose, tuple(names)) for whose, names in also if names)]
    accepted = [n for _, names in groups for n in names]
    unknown = [k for k in options if k not in accepted]
    if unknown:
        raise ValueError(unknown_options_message(name, unknown, groups))


def unknown_options_message(name: str, unknown: Sequence[str],
                            groups: Sequence[tuple[str, Sequence[str]]]) -> str:
    """The message for ``unknown`` options of method ``name``, e.g. ``unknown option
    'keep_ration' for attention_mass; did you mean 'keep_ratio'? accepted: variant
    (attention_mass); keep_ratio, after_layer, ... (the hf_encoder host); stack (patch)``."""
    accepted = list(dict.fromkeys(n for _, names in groups for n in names))

    def close(key: str) -> str:
        hits = difflib.get_close_matches(key, accepted, n=3, cutoff=0.6)
        return f"did you mean {' or '.join(map(repr, hits))}?" if hits else ""

    if len(unknown) == 1:
        hint = close(unknown[0])
        head = f"unknown option {unknown[0]!r} for {name}; " + (f"{hint} " if hint else "")
    else:
        named = ", ".join(f"{k!r} ({close(k)})" if close(k) else repr(k) for k in unknown)
        head = f"unknown options {named} for {name}; "
    listed = "; ".join(f"{', '.join(names)} ({whose})" for whose, names in groups if names)
    return head + f"accepted: {listed or 'none'}"


def create(name: str, context: Mapping | None = None, **options):
    """Build the method module ``name`` with keyword ``options``; unknown options raise
    ValueError naming them, the close accepted ones and all accepted ones (before any work
    starts).

    ``context`` holds facts a host knows about the model (``d_model``, ``n_classes``,
    ``n_layers``, ``n_heads``); each is passed only if the method's ``__init__`` takes it and
    the user did not set it.
    """
    spec = get(name)
    check_options(name, options)
    params = inspect.signature(spec.cls.__init__).parameters
    for key, value in (context or {}).items():
        if key in params and key not in options:
            options[key] = value
    return spec.cls(**options)
