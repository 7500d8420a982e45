"""Save and load patched models: ``save_pretrained`` / ``from_pretrained`` (deployment contract).

A saved folder is a plain Hugging Face folder plus two files of ours:

    config.json, model.safetensors   the *unpatched* base model (``model.save_pretrained``):
                                     any HF tool loads it as the stock model
    tokenizer files                  when a tokenizer is given
    attnprune.json                   the recipe: format and attnprune versions, the HF class
                                     (auto class + architectures) and attention implementation,
                                     and per patch (one, two when stacked, none for a stock
                                     model) the method name, every option given to ``patch``,
                                     the resolved schedule and the prefix of its tensors
    attnprune.safetensors            the methods' own parameters and buffers (LTP thresholds,
                                     entropy head, DTR policy, crisp's entropy EMA, ...)

Why this split rather than one state dict of the patched model: the base weights stay loadable
by anything that reads HF folders, the method's tensors do not depend on the submodule name a
host chose (``attnprune_method``, ``attnprune_method_2`` when stacked), and replaying
``attnprune.patch`` with the recorded options rebuilds exactly the wiring the tensors belong to.
Only safetensors and JSON are read: nothing is unpickled, and nothing is fetched (the HF model
is loaded with ``local_files_only=True``).

A model compacted by :func:`attnprune.deploy.compact_ffn.compact` (dead FFN units cut out) has FFN
projections smaller than its config says; format version 2 records their sizes in an
``ffn_compact`` entry (FFN module name → units kept, plus the config's original size), and
``from_pretrained`` builds the model from its config, shrinks those FFNs
(:func:`compact_ffn.resize`), then loads ``model.safetensors`` into it (strictly). Such a
folder's ``model.safetensors`` does not fit the stock config, so plain transformers cannot load
it; stock models are still written as format 1 and version-1 files still load.

``from_pretrained`` checks the rebuilt schedule against the recorded one, so a change of how a
newer attnprune reads the same options is an error, not silently different outputs.

A patched sentence-transformers ``SentenceTransformer`` is saved as a sentence-transformers
folder (``modules.json``, ``1_Pooling/``, ...) whose Transformer module folder is the folder
above (the base encoder, ``attnprune.json``, ``attnprune.safetensors``) and whose
``modules.json`` names that module ``attnprune.deploy.st_module.PrunedTransformer``: when
sentence-transformers loads it, it re-applies the recipe to the whole model (encoder and
pooling). sentence-transformers imports a module class outside its own package only with
``trust_remote_code=True``, so a plain ``SentenceTransformer(folder)`` stops with its error
instead of loading the distilled weights unpruned; ``attnprune.from_pretrained(folder)`` and
``SentenceTransformer(folder, trust_remote_code=True)`` (attnprune installed) load it pruned.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from torch import nn

from attnprune import api
from attnprune.compat import attn_implementation, model_from_config
from attnprune.hosts.sentence_transformers import is_sentence_transformers_model
from attnprune.methods import registry

__all__ = ["FORMAT_VERSION", "RECIPE", "ST_MODULE", "WEIGHTS", "from_pretrained",
           "save_pretrained"]

RECIPE = "attnprune.json"
WEIGHTS = "attnprune.safetensors"
FORMAT = "attnprune"
# modules.json's type for the Transformer module of a saved pruned SentenceTransformer
ST_MODULE = "attnprune.deploy.st_module.PrunedTransformer"
_ST_STOCK = "sentence_transformers.models.Transformer"
FORMAT_VERSION = 2  # bump when attnprune.json changes incompatibly; readers refuse newer ones
# 2: ``ffn_compact`` (compacted FFNs); a file without it is written as 1, readable by older ones

# (auto class, its name table in transformers.models.auto.modeling_auto), most specific first:
# the first table that maps the model's ``model_type`` to its class gives the auto class.
_AUTO_CLASSES = (
    ("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    ("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("AutoModelForMultipleChoice", "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES"),
    ("AutoModelForNextSentencePrediction", "MODEL_FOR_NEXT_SENTENCE_PREDICTION_MAPPING_NAMES"),
    ("AutoModelForPreTraining", "MODEL_FOR_PRETRAINING_MAPPING_NAMES"),
    ("AutoModel", "MODEL_MAPPING_NAMES"),
)


def _version() -> str:
    from attnprune import __version__

    return __version__


# ----------------------------------------------------------------------------- save
def save_pretrained(model: nn.Module, path: str | os.PathLike, tokenizer=None) -> Path:
    """Save ``model`` (patched, stacked or stock) to the folder ``path``; returns the folder.

    The folder is written beside ``path`` and renamed into place, so a reader never sees a
    half-written model; an existing saved-model folder at ``path`` is replaced, any other
    non-empty folder is refused. Options that JSON cannot hold are refused by name before
    anything is written.
    """
    from safetensors.torch import save_file
    from transformers import PreTrainedModel

    if is_sentence_transformers_model(model):
        return _save_sentence_transformer(model, Path(path), tokenizer)
    if not isinstance(model, PreTrainedModel):
        raise ValueError(f"model: save_pretrained needs a Hugging Face PreTrainedModel, got "  # noqa: TRY004 (the API's errors are ValueErrors)
                         f"{type(model).__name__}")
    quantized = [n for n, m in model.named_modules()
                 if type(m).__module__.startswith(("torch.ao.nn.quantized", "torchao."))]
    if quantized:
        raise ValueError(f"model: {quantized[0]} is int8-quantized; save the fp32 model and "
                         f"quantize after loading (attnprune.quantize_int8)")
    path = Path(path)
    check_target(path)
    states = _states(model)
    stock = _stock_class(model)
    patches, tensors, owned = [], {}, []
    for i, s in enumerate(states):
        prefix = f"patches.{i}."
        patches.append({"method": s.requested, "resolved_method": s.method, "kind": s.kind,
                        "options": _json_options(s), "schedule": _schedule(s),
                        "tensors_prefix": prefix})
        for k, v in s.modules.state_dict().items():
            tensors[prefix + k] = v.detach().to("cpu").clone().contiguous()
        owned += [n for n, m in model.named_modules(remove_duplicate=False) if m is s.modules]
    compacted = _compacted_ffns(model)
    recipe = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION if compacted else 1,
        "attnprune_version": _version(),
        "auto_class": _auto_class(model, stock),
        "architectures": [stock.__name__],
        "attn_implementation": _base_attn_implementation(model, states),
        "patches": patches,
    }
    if compacted:
        recipe["ffn_compact"] = compacted
    # The base weights without the methods' submodules: the stock model's state dict.
    base = {k: v for k, v in model.state_dict().items()
            if not any(k.startswith(n + ".") for n in owned)}
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        model.save_pretrained(tmp, state_dict=base)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if tensors:
            save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / RECIPE).write_text(json.dumps(recipe, indent=2, allow_nan=False) + "\n")
        _replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _states(model: nn.Module) -> list:
    state = api.patch_state(model)
    if state is None:
        return []
    return list(getattr(state, "states", [state]))


def _compacted_ffns(model: nn.Module) -> dict | None:
    """``{"original_units", "sizes": {FFN name: units}}`` when some FFN is smaller than the
    config's intermediate size (a compacted model), else None."""
    from attnprune.deploy import compact_ffn
    cfg = model.config
    full = next((getattr(cfg, k) for k in ("intermediate_size", "hidden_dim", "n_inner")
                 if isinstance(getattr(cfg, k, None), int)), None)
    if full is None and getattr(cfg, "model_type", None) == "gpt2":
        full = 4 * cfg.n_embd  # GPT-2's n_inner = None means 4·d
    try:
        sizes = compact_ffn.ffn_sizes(model)
    except ValueError:  # no FFN compact_ffn knows: nothing can have been compacted
        return None
    if full is None or all(n == full for n in sizes.values()):
        return None
    return {"original_units": int(full), "sizes": {k: int(v) for k, v in sizes.items()}}


def check_target(path: Path) -> None:
    """Refuse to replace a folder that is not a saved model (e.g. a results folder): a
    ValueError naming ``path``, raised before anything is written."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"path: {path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()):
        marks = (RECIPE, "config.json", "model.safetensors", "modules.json")
        if not any((path / m).exists() for m in marks):
            raise ValueError(f"path: {path} is a non-empty folder that holds no saved model "
                             f"({', '.join(marks)}); refusing to replace it")


def _replace_dir(tmp: Path, path: Path) -> None:
    """Move the finished folder ``tmp`` to ``path`` (renames only; an old one is removed last)."""
    if not path.exists():
        os.replace(tmp, path)
        return
    old = path.parent / f".{path.name}.old-{os.getpid()}"
    if old.exists():
        shutil.rmtree(old)
    os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def _json_options(state) -> dict:
    """The options given to ``patch``, as JSON; ValueError naming an option JSON cannot hold."""
    out = {}
    for key, value in state.options.items():
        try:
            out[key] = json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError):
            raise ValueError(f"options: {state.method!r} option {key}={value!r} cannot be written "
                             f"to {RECIPE} (numbers, strings, booleans, None, lists and dicts "
                             f"only)") from None
    return out


def _schedule(state):
    """What the options resolved to, for the load-time check: the encoder host's cumulative
    keep ratios, the causal host's decision layers and budget, crisp's per-layer sparsity."""
    if hasattr(state, "schedule") and isinstance(state.schedule, tuple):
        return {"keep_ratios": [float(v) for v in state.schedule]}
    if hasattr(state, "method_module") and hasattr(state, "layers"):
        kr = state.keep_ratio
        return {"layers": [int(v) for v in state.layers],
                "keep_ratio": None if kr is None else float(kr)}
    layer_sparsity = getattr(state.modules, "layer_sparsity", None)
    if callable(layer_sparsity):
        return {"layer_sparsity": [float(v) for v in layer_sparsity()]}
    return None


def _stock_class(model: nn.Module) -> type:
    """The model's transformers class (a user's subclass: the transformers class it extends)."""
    for cls in type(model).__mro__:
        if cls.__module__.startswith("transformers."):
            return cls
    return type(model)


def _auto_class(model: nn.Module, stock: type) -> str | None:
    from attnprune.compat import auto_model_class_names

    model_type = getattr(model.config, "model_type", None)
    for auto, table in _AUTO_CLASSES:
        names = auto_model_class_names(table).get(model_type)
        names = names if isinstance(names, (list, tuple)) else (names,)
        if stock.__name__ in names:
            return auto
    return None


def _base_attn_implementation(model: nn.Module, states: list) -> str | None:
    """The attention implementation the stock model used (the attention host replaces it)."""
    for s in states:
        if hasattr(s, "previous") and hasattr(s, "impl"):
            return s.previous
    return attn_implementation(model.config)


# ----------------------------------------------------------------------------- load
def from_pretrained(path: str | os.PathLike, **hf_kwargs) -> nn.Module:
    """The model saved by :func:`save_pretrained` in ``path``: the HF model loaded offline with
    its recorded class, patched again with the recorded method(s) and options, the methods'
    tensors restored; same outputs as the saved model. In eval mode, like transformers'.

    ``hf_kwargs`` go to transformers' ``from_pretrained`` (``device_map``, ``dtype``, ...).
    A folder of a saved SentenceTransformer gives the SentenceTransformer, patched again;
    ``hf_kwargs`` then go to ``SentenceTransformer`` (``device``, ``model_kwargs``, ...).
    Errors (ValueError): ``path`` not a folder; no ``attnprune.json`` (a plain HF folder: load
    it with transformers); a newer format; an unknown method; tensors or a schedule that the
    rebuilt patch does not match (typically another attnprune version).
    """
    folder = Path(path)
    if is_saved_sentence_transformer(folder):
        return _load_sentence_transformer(folder, **hf_kwargs)
    recipe = read_recipe(folder)
    cls = _model_class(recipe)
    kwargs = {"local_files_only": True, **hf_kwargs}
    if recipe.get("attn_implementation") and "attn_implementation" not in kwargs:
        kwargs["attn_implementation"] = recipe["attn_implementation"]
    if recipe.get("ffn_compact"):
        model = _load_compacted(cls, folder, recipe["ffn_compact"], kwargs)
    else:
        model = cls.from_pretrained(str(folder), **kwargs)
    if not recipe["patches"]:
        return model
    apply_recipe(model, recipe, folder)
    return model.eval()


def apply_recipe(model: nn.Module, recipe: dict, folder: Path) -> None:
    """Patch ``model`` (the loaded base model, or the SentenceTransformer around it) with the
    recipe's method(s) and options, restore the methods' tensors from ``folder`` and check
    the rebuilt schedule against the saved one; the methods are left in eval mode."""
    from safetensors.torch import load_file

    patches = recipe["patches"]
    tensors = load_file(str(folder / WEIGHTS)) if (folder / WEIGHTS).is_file() else {}
    where = _origin(recipe)
    for i, p in enumerate(patches):
        try:
            api.patch(model, p["method"], stack=i > 0, **p["options"])
        except ValueError as e:
            raise ValueError(f"{folder / RECIPE}: re-applying {p['method']!r} failed{where}: "
                             f"{e}") from e
    for s, p in zip(_states(model), patches, strict=True):
        prefix = p["tensors_prefix"]
        own = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        try:
            s.modules.load_state_dict(own, strict=True)
        except RuntimeError as e:
            raise ValueError(f"{folder / WEIGHTS}: the tensors of {p['method']!r} do not fit the "
                             f"rebuilt method{where}: {e}") from e
        rebuilt = json.loads(json.dumps(_schedule(s)))
        if rebuilt != p["schedule"]:
            raise ValueError(f"{folder / RECIPE}: {p['method']!r} rebuilt with schedule {rebuilt}, "
                             f"saved with {p['schedule']}{where}")
        # eval mode for the methods too, as transformers returns the model: the encoder and
        # attention hosts leave a new method module in training mode (crisp would update its
        # entropy EMA, LTP calibrate its thresholds, on the first forward)
        s.modules.eval()


def _load_compacted(cls, folder: Path, record: dict, kwargs: dict) -> nn.Module:
    """A compacted model: built from its config, FFNs shrunk to the recorded sizes, then
    ``model.safetensors`` loaded strictly (safetensors only: nothing unpickled)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from attnprune.deploy import compact_ffn
    supported = {"local_files_only", "attn_implementation", "dtype", "torch_dtype"}
    other = sorted(set(kwargs) - supported)
    if other:
        raise ValueError(f"{other[0]}: not supported when loading a compacted model "
                         f"(ffn_compact in {RECIPE}); load it, then move it")
    cfg = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    extra = {"attn_implementation": kwargs["attn_implementation"]} if kwargs.get(
        "attn_implementation") else {}
    model = model_from_config(cls, cfg, **extra)
    try:
        compact_ffn.resize(model, dict(record["sizes"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{folder / RECIPE}: bad ffn_compact record: {e}") from e
    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise ValueError(f"path: {folder} has no model.safetensors")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # a tied LM head is saved once (under the embedding's name): missing only when tied
    if unexpected or (missing and not getattr(model.config, "tie_word_embeddings", False)):
        raise ValueError(f"{folder}: model.safetensors does not fit the compacted model: "
                         f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
    if missing:
        model.tie_weights()
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if dtype is not None and dtype != "auto":
        model = model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    return model.eval()


# ----------------------------------------------------------------------------- sentence-transformers
def _save_sentence_transformer(model: nn.Module, path: Path, tokenizer) -> Path:
    """A (patched) SentenceTransformer as a sentence-transformers folder whose Transformer
    module folder holds the base encoder and the recipe, and whose ``modules.json`` names
    :data:`ST_MODULE` for it (the class that re-applies the recipe on load)."""
    if tokenizer is not None:
        raise ValueError("tokenizer: a SentenceTransformer saves its own tokenizer; leave "
                         "tokenizer out")
    children = list(model.children())
    encoder = getattr(children[0], "auto_model", None) if children else None
    if not isinstance(encoder, nn.Module):
        raise ValueError(f"model: its first module must be a sentence-transformers Transformer "  # noqa: TRY004 (the API's errors are ValueErrors)
                         f"with a Hugging Face model (auto_model), got "
                         f"{type(children[0]).__name__ if children else 'none'}")
    check_target(path)
    patched = api.patch_state(model) is not None
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    enc_tmp = path.parent / f".{path.name}.encoder-{os.getpid()}"
    for t in (tmp, enc_tmp):
        if t.exists():
            shutil.rmtree(t)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # the class's save, not the instance's (a patched model's instance save refuses)
        type(model).save(model, str(tmp))
        modules = json.loads((tmp / "modules.json").read_text())
        entry = next(m for m in modules if int(m["idx"]) == 0)
        sub = tmp / entry["path"]
        if patched:
            # the encoder as save_pretrained writes a patched HF model: the stock weights
            # (without the method's submodules) plus attnprune.json / attnprune.safetensors
            save_pretrained(encoder, enc_tmp)
            for f in [*sub.glob("model*.safetensors"), *sub.glob("model*.safetensors.index.json")]:
                f.unlink()
            for f in enc_tmp.iterdir():
                shutil.move(str(f), str(sub / f.name))
            entry["type"] = ST_MODULE
        elif entry["type"] == ST_MODULE:  # loaded pruned, unpatched since: a stock folder
            entry["type"] = _ST_STOCK
            for name in (RECIPE, WEIGHTS):
                (sub / name).unlink(missing_ok=True)
        (tmp / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
        _replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(enc_tmp, ignore_errors=True)
    return path


def is_saved_sentence_transformer(folder: Path) -> bool:
    """Whether ``folder`` is a SentenceTransformer saved pruned (modules.json names ours)."""
    file = folder / "modules.json"
    if not file.is_file():
        return False
    try:
        modules = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from None
    return isinstance(modules, list) and any(
        isinstance(m, dict) and m.get("type") == ST_MODULE for m in modules)


def _load_sentence_transformer(folder: Path, **st_kwargs) -> nn.Module:
    """The saved pruned SentenceTransformer in ``folder``, patched again (by
    :class:`attnprune.deploy.st_module.PrunedTransformer` when sentence-transformers builds
    it). sentence-transformers imports a module class outside its package only with
    ``trust_remote_code=True``; it is given after checking that the folder names no class
    but sentence-transformers' own and ours, holds no Python file that class name could
    resolve to, and that its HF configs point to no custom code, so nothing from the folder
    runs."""
    from sentence_transformers import SentenceTransformer

    modules = json.loads((folder / "modules.json").read_text())
    for m in modules:
        ref = m.get("type", "")
        if ref != ST_MODULE and not ref.startswith("sentence_transformers."):
            raise ValueError(f"{folder / 'modules.json'}: module {m.get('name')!r} is "
                             f"{ref!r}, neither sentence-transformers' nor attnprune's; load "
                             f"this folder with sentence-transformers itself")
        sub = folder / m.get("path", "")
        cfg = sub / "config.json"
        if cfg.is_file() and "auto_map" in json.loads(cfg.read_text()):
            raise ValueError(f"{cfg}: auto_map names custom model code; attnprune loads "
                             f"only stock transformers classes")
    if any(folder.glob("*.py")):
        raise ValueError(f"path: {folder} holds Python files; a folder written by "
                         f"attnprune.save_pretrained holds none")
    for key in ("trust_remote_code", "local_files_only"):
        if key in st_kwargs:
            raise ValueError(f"{key}: set by attnprune.from_pretrained (a local folder whose "
                             f"classes it has checked)")
    model = SentenceTransformer(str(folder), trust_remote_code=True, local_files_only=True,
                                **st_kwargs)
    return model.eval()


def read_recipe(folder: str | os.PathLike) -> dict:
    """The checked ``attnprune.json`` of a saved folder (format, version, methods known)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"path: {folder} is not a folder")
    file = folder / RECIPE
    if not file.is_file():
        if (folder / "config.json").is_file():
            raise ValueError(f"path: {folder} has no {RECIPE}: it is a plain Hugging Face folder, "
                             f"not one written by attnprune.save_pretrained. Load it with "
                             f"transformers (e.g. AutoModelForSequenceClassification"
                             f".from_pretrained({str(folder)!r})) and patch it with "
                             f"attnprune.patch")
        raise ValueError(f"path: {folder} holds neither {RECIPE} nor config.json: not a saved "
                         f"model folder")
    try:
        recipe = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(recipe, dict) or recipe.get("format") != FORMAT:
        raise ValueError(f"{file}: not an attnprune recipe (format != {FORMAT!r})")
    version = recipe.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise ValueError(f"{file}: format_version {version!r}, written by attnprune "
                         f"{recipe.get('attnprune_version')}; this attnprune ({_version()}) reads "
                         f"format versions 1..{FORMAT_VERSION}: upgrade attnprune")
    patches = recipe.get("patches")
    if not isinstance(patches, list):
        raise ValueError(f"{file}: 'patches' must be a list")  # noqa: TRY004 (a bad file, not a bad argument)
    for p in patches:
        if not isinstance(p, dict) or not isinstance(p.get("options"), dict) or "method" not in p:
            raise ValueError(f"{file}: every patch needs 'method' and 'options', got {p!r}")
        try:
            registry.get(p["method"])
        except ValueError as e:
            raise ValueError(f"{file}: {e}{_origin(recipe)}") from None
    return recipe


def _origin(recipe: dict) -> str:
    v = recipe.get("attnprune_version")
    return "" if v == _version() else f" (saved by attnprune {v}, this is {_version()})"


def _model_class(recipe: dict):
    """The transformers class to load with: the recorded auto class, else the architecture."""
    import transformers

    name = recipe.get("auto_class")
    if name is None:
        archs = recipe.get("architectures") or []
        name = archs[0] if archs else None
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise ValueError(f"{RECIPE}: no transformers class {name!r} to load the model with")
    return cls
