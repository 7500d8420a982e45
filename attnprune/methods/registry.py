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

import importlib
import inspect
from dataclasses import dataclass

KINDS = ("token", "attention", "loss")


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
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise ValueError(f"method {name!r} is already registered by {_REGISTRY[name].cls}")
        doc = (inspect.getdoc(cls) or "").strip().splitlines()
        _REGISTRY[name] = MethodSpec(name, kind, cls, doc[0] if doc else "", paper)
        cls.method_name = name
        cls.method_kind = kind
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


def create(name: str, context: dict | None = None, **options):
    """Build the method module ``name`` with keyword ``options``; unknown options raise
    ValueError naming them and the accepted ones (before any work starts).

    ``context`` holds facts a host knows about the model (``d_model``, ``n_classes``,
    ``n_layers``, ``n_heads``); each is passed only if the method's ``__init__`` takes it and
    the user did not set it.
    """
    spec = get(name)
    sig = inspect.signature(spec.cls.__init__)
    params = sig.parameters
    for key, value in (context or {}).items():
        if key in params and key not in options:
            options[key] = value
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not accepts_any:
        known = [p for p in params if p != "self"]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(
                f"method {name!r}: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(known)}"
            )
    return spec.cls(**options)
