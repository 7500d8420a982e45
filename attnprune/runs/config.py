"""Configs: frozen dataclasses, filled from a YAML file and ``--key value`` overrides.

Every command owns one frozen dataclass (``SyntheticConfig``, ``FinetuneConfig``, …). This
module turns a YAML file plus command-line overrides into an instance, rejecting unknown keys
and values of the wrong type with a message naming the field, before any work starts (timm's
resolved ``args.yaml``). Validation of ranges lives in each config's ``__post_init__``.

Written by hand: argparse does not know dataclasses, and the well-kept alternatives (hydra,
omegaconf, simple-parsing) would be a framework for a few dozen lines.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

__all__ = ["RUN_CONTROL_KEYS", "CommandLine", "ConfigError", "UnknownKeyError", "check_out",
           "check_training_fields", "coerce_value", "command_line_message", "config_differences",
           "dump_yaml", "load_config", "parse_command_line", "parse_overrides", "plain",
           "print_help", "read_yaml", "to_dict"]

# Options that steer how a command runs, not what it computes: a re-run into a results folder
# may change them (pareto's ``--phase summary``, the attention sweeps' ``--tabulate-only``, the
# progress bars), and they are not taken over from the folder's config.yaml.
RUN_CONTROL_KEYS = frozenset({"progress", "phase", "tabulate_only"})


class ConfigError(ValueError):
    """A bad configuration value; the message names the field."""


class UnknownKeyError(ConfigError):
    """A key the config class does not have: ``key``, the close ``suggestions`` (difflib) and
    every ``known`` key, so the command line can name the option as it was typed."""

    def __init__(self, key: str, cls_name: str, known: list[str]) -> None:
        self.key, self.cls_name, self.known = key, cls_name, sorted(known)
        self.suggestions = close_names(key, self.known)
        hint = f"; did you mean {' or '.join(self.suggestions)}?" if self.suggestions else ""
        super().__init__(f"{key}: unknown key for {cls_name}{hint}; known keys: "
                         f"{', '.join(self.known)}")

    def __reduce__(self):  # pickled whole (a multi-process run sends process 0's error on)
        return type(self), (self.key, self.cls_name, self.known), self.__dict__


def close_names(name: str, choices: list[str], n: int = 3) -> list[str]:
    """Up to ``n`` names of ``choices`` close to the mistyped ``name`` (difflib), best first."""
    import difflib

    return difflib.get_close_matches(name, choices, n=n, cutoff=0.6)


def parse_overrides(args: list[str]) -> dict[str, str | bool]:
    """``["--keep-ratio", "0.5", "--quick"]`` → ``{"keep_ratio": "0.5", "quick": True}``.

    ``--key=value`` works too; a flag without a value is True. Dashes become underscores.
    """
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--") or a == "--":
            raise ConfigError(f"unexpected argument {a!r}: options are --key value")
        key = a[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        elif i + 1 < len(args) and not (args[i + 1].startswith("--") and len(args[i + 1]) > 2):
            value = args[i + 1]
            i += 2
        else:
            value = True
            i += 1
        out[key.replace("-", "_")] = value
    return out


def coerce_value(name: str, tp: Any, value: Any) -> Any:
    """Convert ``value`` (from YAML or the command line) to the annotated type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce_value(name, a, value)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{name}: bad value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            close = close_names(str(value), [str(a) for a in args])
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{name}: must be one of {', '.join(map(repr, args))}, "
                              f"got {value!r}{hint}")
        return value
    if origin in (tuple, list):
        if isinstance(value, str):
            text = value.strip()
            value = yaml.safe_load(text) if text.startswith("[") else [v for v in text.split(",") if v]
        if not isinstance(value, (list, tuple)):
            value = [value]
        inner = args[0] if args else Any
        items = [coerce_value(f"{name}[{i}]", inner, v) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
        if f != int(f):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return int(f)
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return str(value)
    return value


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML mapping from ``path``; ConfigError names the problem (missing, not YAML, not a mapping)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config: file not found: {p}")
    try:
        loaded = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config: {p} is not valid YAML: {e}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config: {p} must hold a mapping of key: value")
    return loaded


def load_config(cls: type[T], path: str | os.PathLike | None = None,
                overrides: dict[str, Any] | list[str] | None = None) -> T:
    """Build ``cls`` from the YAML file ``path`` (optional) and ``overrides``.

    Unknown keys, wrong types and a missing file raise :class:`ConfigError` naming the field.
    Range checks run in ``cls.__post_init__`` (their ValueError is re-raised as ConfigError).
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    data.update(overrides or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise UnknownKeyError(unknown[0], cls.__name__, list(fields))
    values = {k: coerce_value(k, hints[k], v) for k, v in data.items()}
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from None


def check_training_fields(cfg: Any) -> None:
    """The range checks every fine-tuning experiment config shares: ``max_train``,
    ``max_eval`` and ``threads`` (None or >= 1), ``lr`` (> 0), ``mixed_precision`` (if the
    config has it) and ``seeds`` (at least one). Call from ``__post_init__``."""
    for name in ("max_train", "max_eval", "threads"):
        v = getattr(cfg, name)
        if v is not None and v < 1:
            raise ValueError(f"{name}: must be >= 1, got {v}")
    if cfg.lr <= 0:
        raise ValueError(f"lr: must be > 0, got {cfg.lr}")
    mp = getattr(cfg, "mixed_precision", "no")
    if mp not in ("no", "bf16", "auto"):
        raise ValueError(f"mixed_precision: 'no', 'bf16' or 'auto' (quote \"no\" in YAML), "
                         f"got {mp!r}")
    if not cfg.seeds:
        raise ValueError("seeds: give at least one seed")


def to_dict(cfg: Any) -> dict:
    """A plain dict of a config (tuples as lists), for YAML and JSON."""
    d = dataclasses.asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def config_differences(saved: dict[str, Any], cfg: Any) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved value, cfg's value)}`` for the keys of the config ``cfg`` whose value
    differs from ``saved`` (a results folder's config.yaml), :data:`RUN_CONTROL_KEYS` aside.
    Values are compared as YAML writes and reads them (tuples as lists); a key the saved file
    lacks (a folder from before the key existed) counts as its default."""
    now = yaml.safe_load(dump_yaml(cfg))
    out = {}
    for f in dataclasses.fields(cfg):
        if f.name not in now or f.name in RUN_CONTROL_KEYS:
            continue
        if f.name in saved:
            old = saved[f.name]
        elif f.default is not dataclasses.MISSING:
            old = yaml.safe_load(yaml.safe_dump(_yaml_value(f.default)))
        elif f.default_factory is not dataclasses.MISSING:
            old = yaml.safe_load(yaml.safe_dump(_yaml_value(f.default_factory())))
        else:
            old = None  # a required field the folder lacks: it differs from any value given
        if old != now[f.name]:
            out[f.name] = (old, now[f.name])
    return out


def _yaml_value(v: Any) -> Any:
    """One value as :func:`to_dict` writes it (tuples as lists)."""
    return list(v) if isinstance(v, tuple) else v


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """What every command shares: its config, the results folder and the run flags."""

    config: Any
    out: Path
    exact_out: bool  # write into ``out`` itself (resume) rather than a new timestamped folder
    config_path: str | None


def _option_text(v: Any) -> str:
    """A default as it is typed on the command line: ``0.3,0.5`` for a tuple, ``none``,
    ``true``, JSON for a mapping."""
    import json

    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (tuple, list)):
        return ",".join(_option_text(x) for x in v) or "(none)"
    if isinstance(v, dict):
        return json.dumps(v)
    return str(v)


def _field_comments(cls: type) -> dict[str, str]:
    """``{field: its end-of-line comment}`` from the class source (the comments are the
    fields' documentation); empty when the source cannot be read."""
    import inspect
    import re

    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out = {}
    for m in re.finditer(r"^\s+(\w+): [^=\n]+(?:=[^#\n]*)?#\s*(.+)$", src, re.MULTILINE):
        out.setdefault(m.group(1), m.group(2).strip())
    return out


def plain(text: str) -> str:
    """Help text as a terminal shows it: Sphinx roles (``:func:`x``` → x) and double
    backquotes dropped, "§" spelled out."""
    import re

    text = re.sub(r":[a-z]+(?::[a-z]+)?:`~?([^`]*?)`", r"\1", text)
    return text.replace("``", "").replace("§", "section ")


# The run flags every command that writes a results folder takes (parse_command_line)
RUN_FLAGS = (
    ("--config FILE.yaml", "options from a YAML file (options given on the line override it)"),
    ("--out DIR", ("(default {out}) the results folder: a new <command>-<date>-<time> folder "
                   "is made inside DIR; a DIR that holds config.yaml is resumed")),
    ("--exact-out", "write into DIR itself instead of a new timestamped folder"),
)


def print_help(doc: str | None, cls: type, default_out: str | None = "results",
               extra: tuple[tuple[str, str], ...] = ()) -> None:
    """A command's ``--help``: its docstring as plain text, then every option of its config
    dataclass ``cls`` with its default (as typed on the command line) and its comment, then
    the run flags (``--config``, ``--out``, ``--exact-out``) unless ``default_out`` is None,
    and ``extra`` (flag, text) pairs of the command's own."""
    print(plain(doc or "").rstrip() + "\n")
    print("options (--key value; every option also reads from --config FILE.yaml):")
    notes = _field_comments(cls)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        note = plain(notes.get(f.name, ""))
        line = f"  --{f.name.replace('_', '-'):<22} (default {_option_text(default)})"
        print(f"{line}  {note}" if note else line)
    flags = (RUN_FLAGS if default_out is not None else ()) + tuple(extra)
    if flags:
        print("\nrun flags:")
        for flag, text in flags:
            print(f"  {flag:<24} {text.format(out=default_out)}")


def check_out(out: str | os.PathLike) -> Path:
    """``--out`` must name a folder (existing or not) this process can write in: a file
    there, a file where one of its parent folders should be, or a folder where nothing can be
    created is a ConfigError naming --out, before any work starts.

    Writing is tried, not predicted from permission bits (root passes those, yet a read-only
    mount or sysfs refuses it): an empty temporary folder is made in ``out``, or in its
    nearest existing parent, and removed at once; nothing else is created."""
    import tempfile

    p = Path(out)
    for q in (p, *p.parents):
        if q.exists() and not q.is_dir():
            what = "is a file" if q == p else f"sits below the file {q}"
            raise ConfigError(f"out: --out {p} {what}, not a folder; give a folder path")
    base = next((q for q in (p, *p.parents) if q.is_dir()), Path.cwd())
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attnprune-write-check-", dir=base))
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise ConfigError(f"out: --out {p}: cannot write in {base} ({why}); give a folder "
                          "you can write to") from None
    return p


def _typed_options(argv: list[str]) -> dict[str, tuple[str, str | bool]]:
    """``{key: (the flag as typed, its value)}`` of a command line (``--keep-ratio 0.5``,
    ``--keep_ratio=0.5``); arguments that are not options are left out."""
    out: dict[str, tuple[str, str | bool]] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("--") or a == "--":
            continue
        flag, eq, value = a.partition("=")
        if not eq:
            value = True
            if i < len(argv) and not (argv[i].startswith("--") and len(argv[i]) > 2):
                value = argv[i]
                i += 1
        out[flag[2:].replace("-", "_")] = (flag, value)
    return out


def command_line_message(error: ConfigError, argv: list[str], command: str) -> str:
    """``error`` as the user of ``attnprune <command> argv`` should read it: a field that came
    from the command line is named by the option typed (``--keep-ratio``, not
    ``keep_ratio[0]``; ``--keep-ratios (value 2 of 3)`` for one of several comma-separated
    values), and an unknown option is named with the close ones (difflib). Only errors of
    reading the options (:func:`parse_command_line`) are renamed: a field that came from a
    YAML file or a resumed folder keeps its key name, which is what was written there, and a
    command's later errors (its data, its model) say what they say."""
    import re

    if not getattr(error, "from_command_line", False):
        return str(error)
    typed = _typed_options(argv)
    if isinstance(error, UnknownKeyError) and error.key in typed:
        flag = typed[error.key][0]
        close = [f"--{s.replace('_', '-')}" for s in error.suggestions]
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        return f"{flag}: unknown option{hint} ('attnprune {command} --help' lists them all)"
    text = str(error)
    m = re.match(r"(\w+)(?:\[(\d+)\])?(?::\s*|\s+(?=\S))", text)
    if not m or m.group(1) not in typed:
        return text
    flag, value = typed[m.group(1)]
    rest = text[m.end():]
    if flag in rest:  # the message names the option itself ("out: --out DIR is a file")
        return text
    if m.group(2) is not None:
        if not isinstance(value, str) or value.lstrip().startswith(("[", "{")):
            return text  # a YAML list typed whole: its index is what the user wrote
        values = [v for v in value.split(",") if v]
        if len(values) > 1:
            flag = f"{flag} (value {int(m.group(2)) + 1} of {len(values)})"
    return f"{flag}: {rest}"


def parse_command_line(argv: list[str], cls: type[T], default_out: str = "results",
                       defaults: dict[str, Any] | None = None) -> CommandLine:
    """Parse ``[--config FILE] [--key value ...] [--out DIR] [--exact-out]`` into a config.

    ``--out DIR`` that already holds a ``config.yaml`` is a results folder: the run resumes
    in it (finished runs are skipped), with the folder's options as the base, so ``--out DIR``
    alone resumes it (an option that differs from the folder's is refused when the folder is
    opened, :meth:`attnprune.runs.results.ResultsDir.start`; :data:`RUN_CONTROL_KEYS` are not taken
    over). Otherwise a new timestamped folder is made inside ``DIR``, unless ``--exact-out`` is
    given. ``defaults`` (e.g. a preset) sit under the folder's options, the file and the
    overrides.
    """
    if "--help" in argv or "-h" in argv:  # a command run as ``python -m`` documents itself too
        print_help(sys.modules[cls.__module__].__doc__, cls, default_out)
        raise SystemExit(0)
    try:
        return _parse_command_line(argv, cls, default_out, defaults)
    except ConfigError as e:
        e.from_command_line = True  # command_line_message may name its options as typed
        raise


def _parse_command_line(argv: list[str], cls: type[T], default_out: str,
                        defaults: dict[str, Any] | None) -> CommandLine:
    opts = parse_overrides(argv)
    config_path = opts.pop("config", None)
    if config_path is True:
        raise ConfigError("config: --config needs a file path")
    out = opts.pop("out", default_out)
    if out is True:
        raise ConfigError("out: --out needs a folder path")
    exact = opts.pop("exact_out", False)
    if exact not in (True, False):
        exact = coerce_value("exact_out", bool, exact)
    merged = dict(defaults or {})
    out_path = check_out(str(out))
    resuming = (out_path / "config.yaml").is_file()
    if resuming:
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        merged.update({k: v for k, v in read_yaml(out_path / "config.yaml").items()
                       if k in fields and k not in RUN_CONTROL_KEYS})
    if config_path is not None:
        merged.update(read_yaml(str(config_path)))
    merged.update(opts)
    cfg = load_config(cls, None, merged)
    if resuming:
        exact = True
    return CommandLine(cfg, out_path, bool(exact), None if config_path is None else str(config_path))
