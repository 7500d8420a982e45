"""Old import paths of modules that moved in the layout change of 0.2 (issue 32).

``attnprune/__init__.py`` appends this folder to the package's ``__path__``, so
``import attnprune.finetune`` finds ``_deprecated/finetune.py`` here; that file calls
:func:`alias`, which warns once and puts the module at its new path in ``sys.modules`` under
the old name (one module object, not a copy). ``python -m attnprune.<old path>`` runs the new
module. Nothing here is imported unless an old path is. Remove in 0.3.
"""

from __future__ import annotations

import importlib
import runpy
import sys
import warnings

REMOVED_IN = "0.3"


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old import path works until attnprune "
                  f"{REMOVED_IN}", DeprecationWarning, stacklevel=4)


def alias(old: str, new: str, run_as_main: bool = False) -> None:
    """Make the module being imported as ``old`` the module ``new``."""
    if run_as_main:  # python -m <old>: run the new module as the program
        _warn(old, new)
        runpy.run_module(new, run_name="__main__", alter_sys=True)
        return
    _warn(old, new)
    sys.modules[old] = importlib.import_module(new)


def forward(old: str, new: str):
    """A package's ``__getattr__`` that reads attributes of the package at its new path (its
    submodules have shims of their own, so ``import <old>.<sub>`` is one module, not a copy)."""
    _warn(old, new)

    def __getattr__(name: str):
        target = importlib.import_module(new)
        try:
            return getattr(target, name)
        except AttributeError:
            return importlib.import_module(f"{new}.{name}")

    return __getattr__
