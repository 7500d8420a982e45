"""The tree tells the architecture (docs/architecture.md): layers import downwards only, no
import circle and a small top level; hosts reach methods through the registry and the base
classes only, and family facts through the one family table; ``api.py`` imports no client of
the library; no module imports another's private names; private torch and transformers names
only in ``compat.py``. Each rule also runs on a planted violation in a throw-away package, so a
check that stopped seeing anything would fail.

The graph is read from the source (every ``import`` statement, function-level ones included),
so a lazy import that crosses a layer is caught as well as a top-level one."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "attnprune"

# layer of a module: the longest matching prefix wins. Higher numbers may import lower ones.
LAYERS = {
    "attnprune": 0, "attnprune.api": 0, "attnprune.selection": 0, "attnprune.measure": 0,
    "attnprune.prefill": 0, "attnprune.methods": 0, "attnprune.hosts": 0, "attnprune.deploy": 0,
    "attnprune.train": 1,
    "attnprune.runs": 2,
    "attnprune.bench": 3, "attnprune.research": 3,
    # the command-line dispatcher sits above everything: it imports the commands by name
    "attnprune.cli": 4, "attnprune.__main__": 4,
}
LAYER_NAMES = {0: "library", 1: "training", 2: "run", 3: "bench/research", 4: "command line"}
# inside the library: a method never imports a host; selection and measure are leaves
INNER = {
    "attnprune.methods": ("attnprune.methods", "attnprune.selection", "attnprune.attention",
                          "attnprune.compat"),
    "attnprune.attention": ("attnprune.selection", "attnprune.compat"),
    "attnprune.selection": (),
    "attnprune.measure": ("attnprune.compat",),
    "attnprune.compat": (),
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in root.rglob("*.py")}


def import_statements(path: Path, name: str) -> list[tuple[int, str, list[str] | None]]:
    """(line, module, names) of every import statement in ``path``, relative ones resolved
    against module ``name``: ``import a.b`` gives ("a.b", None), ``from a import b, c`` gives
    ("a", ["b", "c"])."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.append((node.lineno, base, [a.name for a in node.names]))
    return out


def import_targets(path: Path, name: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every module ``path`` imports, inside attnprune or not (``from pkg
    import sub`` counts as ``pkg.sub`` when that is a module, else as ``pkg``)."""
    out = []
    for line, base, names in import_statements(path, name):
        if names is None:
            out.append((line, base))
        else:
            out += [(line, f"{base}.{n}" if f"{base}.{n}" in known else base) for n in names]
    return out


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The attnprune modules ``path`` imports (``from pkg import sub`` counts as ``pkg.sub``
    when that is a module, else as ``pkg``)."""
    return {t for _, t in import_targets(path, name, known)
            if t == "attnprune" or t.startswith("attnprune.")}


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = source_modules(root)
    return {m: imports_of(p, m, set(mods)) - {m} for m, p in mods.items()}


def packages(root: Path = ROOT) -> set[str]:
    return {module_name(p, root) for p in root.rglob("__init__.py")}


def layer(module: str) -> int:
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len)
    return LAYERS[best]


def layer_violations(g: dict[str, set[str]]) -> list[str]:
    out = []
    for m, targets in sorted(g.items()):
        for t in sorted(targets):
            if layer(t) > layer(m):
                out.append(f"{m} ({LAYER_NAMES[layer(m)]}) imports {t} "
                           f"({LAYER_NAMES[layer(t)]})")
            for prefix, allowed in INNER.items():
                if (m == prefix or m.startswith(prefix + ".")) and t != "attnprune" and not any(
                        t == a or t.startswith(a + ".") for a in allowed):
                    out.append(f"{m} may import only {allowed or 'nothing of attnprune'}, "
                               f"imports {t}")
    return out


def circles(g: dict[str, set[str]], root: Path = ROOT) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan). An edge to a package
    ``__init__`` that re-exports the importer (``attnprune`` → ``api`` → ``attnprune``) is not
    a circle: it is the package reading its own public names, so edges to bare package names
    are left out."""
    pkgs = packages(root)
    edges = {m: {t for t in ts if t in g and t not in pkgs} for m, ts in g.items()}
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out

# ----------------------------------------------------------------------------- hosts and methods
# A host reaches a method through the registry (by name) and the declared protocol (the base
# classes), never a method module: adding or changing a method then never touches a host. The
# bare package ``attnprune.methods`` is not allowed either: its names are the method modules
# (it imports every one so that they register), and the registry loads it by name itself.
HOST_METHOD_IMPORTS = ("attnprune.methods.registry", "attnprune.methods.base")


def host_method_imports(g: dict[str, set[str]]) -> list[str]:
    """Imports of anything of ``attnprune.methods`` by a host, but the registry and the base."""
    return [f"{m} imports {t}" for m, targets in sorted(g.items())
            if m == "attnprune.hosts" or m.startswith("attnprune.hosts.")
            for t in sorted(targets)
            if (t == "attnprune.methods" or t.startswith("attnprune.methods."))
            and t not in HOST_METHOD_IMPORTS]


# ----------------------------------------------------------------------------- api and its clients
# ``attnprune.api`` serves every host alike: it imports no client of the library (deploy/, the
# sentence-transformers package), nor names one by string (``importlib.import_module``).
CLIENTS = ("attnprune.deploy", "sentence_transformers")


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def api_client_imports(root: Path = ROOT) -> list[str]:
    path = root / "api.py"
    known = set(source_modules(root))
    out = [f"api.py:{n}: imports {t}" for n, t in import_targets(path, "attnprune.api", known)
           if _under(t, CLIENTS)]
    out += [f"api.py:{node.lineno}: names {node.value!r}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and _under(node.value, CLIENTS)]
    return sorted(out)


# ----------------------------------------------------------------------------- the family table
# Model-family facts live in one table, ``hosts/families.py``, that every host reads; a host
# never takes them from another host (the token host once read them from the attention host).
FAMILY_TABLE = "attnprune.hosts.families"


def family_imports_elsewhere(root: Path = ROOT) -> list[str]:
    """Imports of the family table's names (its ``__all__``) from any other module."""
    tree = ast.parse((root / "hosts" / "families.py").read_text())
    names = {e.value for node in tree.body if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
             for e in node.value.elts}
    out = []
    for m, path in sorted(source_modules(root).items()):
        for n, base, imported in import_statements(path, m):
            if _under(base, ("attnprune",)) and base != FAMILY_TABLE:
                out += [f"{path.relative_to(root.parent).as_posix()}:{n}: from {base} import {x}"
                        for x in imported or () if x in names]
    return out


# ----------------------------------------------------------------------------- private imports
def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_module(module: str, importer: str) -> str | None:
    """The package that owns ``module``'s first private part, unless ``importer`` is in it."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            owner = ".".join(parts[:i])
            return None if _under(importer, [owner]) else owner
    return None


def private_imports(root: Path = ROOT) -> list[str]:
    """Imports of another module's private names inside the package: ``from attnprune.x import
    _y`` (a private function, class or constant of x). A private module (``bench/_memory.py``)
    belongs to its package: the package's modules may import it, others may not."""
    mods = source_modules(root)
    out = []
    for m, path in sorted(mods.items()):
        rel = path.relative_to(root.parent).as_posix()
        for n, base, names in import_statements(path, m):
            if not _under(base, ("attnprune",)):
                continue
            modules = [base] if names is None else []
            for x in names or ():
                if f"{base}.{x}" in mods:
                    modules.append(f"{base}.{x}")
                else:
                    modules.append(base)
                    if _private(x):
                        out.append(f"{rel}:{n}: from {base} import {x}")
            for module in dict.fromkeys(modules):
                owner = _private_module(module, m)
                if owner is not None:
                    out.append(f"{rel}:{n}: imports {module}, private to {owner}")
    return out


def test_the_library_imports_no_layer_above_it():
    assert layer_violations(graph()) == []


def test_no_import_circle():
    assert circles(graph()) == []


def test_every_import_names_a_module_that_exists_at_its_new_path():
    """Code inside the package imports only modules that exist."""
    g = graph()
    known = set(g)
    stale = sorted(f"{m} imports {t}" for m, ts in g.items() for t in ts if t not in known)
    assert stale == []


def test_the_checks_see_a_planted_upward_import_and_a_circle(tmp_path):
    pkg = tmp_path / "attnprune"
    for rel, text in {
        "__init__.py": "",
        "api.py": "from attnprune.research import finetune\n",
        "methods/__init__.py": "",
        "methods/a.py": "def f():\n    from attnprune.hosts import x\n",
        "hosts/__init__.py": "",
        "hosts/x.py": "from attnprune.hosts import y\n",
        "hosts/y.py": "import attnprune.hosts.x\n",
        "research/__init__.py": "",
        "research/finetune.py": "",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    g = graph(pkg)
    bad = layer_violations(g)
    assert any("attnprune.api (library) imports attnprune.research.finetune" in b for b in bad)
    assert any(b.startswith("attnprune.methods.a may import only") for b in bad)
    assert circles(g, pkg) == [["attnprune.hosts.x", "attnprune.hosts.y"]]


def test_top_level_has_at_most_16_entries():
    """A small top level: the public modules and the layers' folders (15 entries until the
    attention leaf and compat came up from hosts/ and _deprecated/ went)."""
    entries = sorted(p.name for p in ROOT.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 16, entries


def test_import_attnprune_loads_only_the_library():
    code = ("import sys, attnprune; print(' '.join(sorted(m for m in sys.modules "
            "if m.startswith('attnprune'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    above = [m for m in out if layer(m) > 0]
    assert "attnprune.api" in out and above == []


def test_no_source_file_is_ignored_by_git():
    """A package file that .gitignore matches (``runs/`` once matched ``attnprune/runs/``)
    exists here but never reaches a clone: CI would fail on a missing module."""
    import shutil

    repo = ROOT.parent
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    files = [str(p.relative_to(repo)) for p in ROOT.rglob("*.py")]
    r = subprocess.run(["git", "check-ignore", "--no-index", *files], cwd=repo,
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.stdout.split() == []


# Private torch / transformers names, read on the syntax tree (comments and docstrings never
# count): any ``_name`` part of an attribute chain that starts at torch or transformers (or a
# name imported from them, or assigned from such a chain: ``aten = torch.ops.aten``), in an
# import (``import torch._dynamo``, ``from torch._dynamo import …``), in ``getattr``/``hasattr``/
# ``setattr``/``delattr`` on such a chain; and, on any object, the attributes below, private
# state of torch's modules and tensors and transformers' models, configs and interfaces, read
# as ``x._attr``, named by string or as a keyword. Extending nn.Module through ``super()``
# (``_apply``, ``_load_from_state_dict``, which subclasses override) is not on the list.
PRIVATE_ROOTS = ("torch", "transformers")
PRIVATE_ATTRS = frozenset({
    # torch.nn.Module and Tensor internals
    "_modules", "_parameters", "_buffers", "_non_persistent_buffers_set", "_version",
    "_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_hooks",
    "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_call_impl",
    "_compiled_call_impl", "_orig_mod", "_base", "_cdata", "_typed_storage",
    # transformers' PreTrainedModel, PretrainedConfig and attention interfaces
    "_from_config", "_attn_implementation", "_attn_implementation_internal",
    "_output_attentions", "_supports_sdpa", "_supports_flash_attn", "_supports_flex_attn",
    "_supports_attention_backend", "_no_split_modules", "_tied_weights_keys",
    "_keep_in_fp32_modules", "_checkpoint_conversion_mapping", "_is_hf_initialized",
    "_global_mapping", "_auto_class", "_can_record_outputs",
})
ACCESSORS = ("getattr", "hasattr", "setattr", "delattr")


def _chain_root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_api_uses(path: Path) -> list[tuple[int, str]]:
    """(line, what) of every private torch / transformers name ``path`` uses."""
    tree = ast.parse(path.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.asname or a.name.split(".")[0] for a in node.names
                         if a.name.split(".")[0] in PRIVATE_ROOTS)
        elif (isinstance(node, ast.ImportFrom) and not node.level and node.module
              and node.module.split(".")[0] in PRIVATE_ROOTS):
            roots.update(a.asname or a.name for a in node.names)
    grew = True
    while grew:  # names bound to a chain from a root (``aten = torch.ops.aten``)
        grew = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _chain_root(node.value) in roots:
                new = {t.id for t in node.targets if isinstance(t, ast.Name)} - roots
                roots |= new
                grew = grew or bool(new)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update((node.lineno, f"import {a.name}") for a in node.names
                         if a.name.split(".")[0] in PRIVATE_ROOTS
                         and any(map(_private, a.name.split("."))))
        elif (isinstance(node, ast.ImportFrom) and not node.level and node.module
              and node.module.split(".")[0] in PRIVATE_ROOTS):
            if any(map(_private, node.module.split("."))):
                found.add((node.lineno, f"from {node.module} import …"))
            found.update((node.lineno, f"from {node.module} import {a.name}")
                         for a in node.names if _private(a.name))
        elif isinstance(node, ast.Attribute) and _private(node.attr) and (
                node.attr in PRIVATE_ATTRS or _chain_root(node) in roots):
            found.add((node.lineno, f"{_chain_root(node) or '…'}….{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ACCESSORS and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)
              and (node.args[1].value in PRIVATE_ATTRS or _chain_root(node.args[0]) in roots)):
            found.add((node.lineno, f"{node.func.id}(…, {node.args[1].value!r})"))
        elif isinstance(node, ast.Constant) and node.value in PRIVATE_ATTRS:
            found.add((node.lineno, repr(node.value)))
        elif isinstance(node, ast.keyword) and node.arg in PRIVATE_ATTRS:
            found.add((node.lineno, f"{node.arg}=…"))
    return sorted(found)


def private_api_sites(root: Path = ROOT) -> list[str]:
    """Every private torch / transformers name used outside ``compat.py``."""
    return [f"{path.relative_to(root).as_posix()}:{n}: {what}"
            for path in sorted(root.rglob("*.py")) if path.relative_to(root).as_posix() != "compat.py"
            for n, what in private_api_uses(path)]


def transformers_submodule_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a transformers submodule in ``path`` (``from
    transformers.x import y``, ``import transformers.x``); ``from transformers import y`` is
    the public top level and passes."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out += [(node.lineno, n) for n in names if n.startswith("transformers.")]
    return out


def test_transformers_submodules_imported_only_in_the_compat_module():
    """transformers' submodules (masking_utils, modeling_outputs, integrations, models.*, …)
    are private layout that moves between releases: only ``compat.py`` imports them
    (lazy imports included), with the versions it was checked against."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "compat.py":
            continue
        found += [f"{rel}:{n}: {m}" for n, m in transformers_submodule_imports(path)]
    assert found == []


def test_compat_transformers_names_resolve():
    """Every name compat re-exports from a transformers submodule exists in this release."""
    from attnprune import compat

    for name in compat._TRANSFORMERS:
        assert getattr(compat, name) is not None, name
    assert set(compat._TRANSFORMERS) <= set(compat.__all__)


def test_hosts_import_methods_only_through_the_registry_and_the_base():
    assert host_method_imports(graph()) == []


def test_api_imports_no_client_module():
    assert api_client_imports() == []


def test_hosts_read_family_facts_from_the_family_table():
    assert family_imports_elsewhere() == []


def test_no_module_imports_another_modules_private_names():
    assert private_imports() == []


def test_private_torch_and_transformers_names_only_in_the_compat_module():
    """Private names (``config._attn_implementation``, ``module._forward_hooks``, ``w._version``,
    ``cls._from_config``, ``torch._check``, ``torch._dynamo``, aten's ``_scaled_dot_product_*``,
    …) are reached through ``attnprune/compat.py`` alone, which says which versions it was
    checked against."""
    assert private_api_sites() == []


PLANTED = {
    "__init__.py": "",
    "api.py": ("import importlib\n"
               "from attnprune.hosts import x\n"
               "def f(model):\n"
               "    from attnprune.deploy.sentence_transformers import patch\n"
               "    import sentence_transformers.models\n"
               "    return importlib.import_module('attnprune.deploy.onnx')\n"),
    "compat.py": ("import torch\n"
                  "def version(t):\n"
                  "    return t._version, torch._check, getattr(t, '_attn_implementation')\n"),
    "deploy/__init__.py": "",
    "deploy/sentence_transformers.py": "",
    "deploy/onnx.py": "",
    "methods/__init__.py": "",
    "methods/base.py": "",
    "methods/registry.py": "",
    "methods/crisp.py": "def _topk():\n    pass\n",
    "hosts/__init__.py": "",
    "hosts/families.py": "__all__ = ['FAMILIES', 'family']\nFAMILIES = {}\n",
    "hosts/att.py": "from attnprune.hosts.families import FAMILIES, family\n",
    "hosts/tok.py": ("from attnprune.hosts.families import FAMILIES\n"
                     "def f():\n    from attnprune.hosts.att import family\n"),
    "hosts/x.py": ('"""Docstrings and comments may name torch._check and model._modules."""\n'
                   "import torch  # torch._dynamo in a comment\n"
                   "import torch.nn.functional as F\n"
                   "from torch import nn\n"
                   "from attnprune.methods import registry\n"
                   "from attnprune.methods.base import TokenMethod\n"
                   "from attnprune.methods.crisp import fused\n"
                   "from attnprune import methods\n"
                   "aten = torch.ops.aten\n"
                   "def f(model, w, cls, config):\n"
                   "    import torch._dynamo\n"
                   "    from transformers.modeling_utils import _init\n"
                   "    from attnprune.methods import crisp\n"
                   "    torch._check(True)\n"
                   "    torch.ops.mkldnn._is_mkldnn_bf16_supported()\n"
                   "    aten._scaled_dot_product_efficient_attention\n"
                   "    F._pad, nn.modules.module._global_forward_hooks\n"
                   "    getattr(torch.compiler, '_is_exporting_flag', None)\n"
                   "    w._version, cls._from_config(config), model._forward_hooks\n"
                   "    model._parameters, model._buffers, model._modules\n"
                   "    setattr(config, '_attn_implementation', 'eager')\n"
                   "    config.__dict__.update(_output_attentions=False)\n"
                   "    return model.__class__, torch.__version__, model._own, super()._apply\n"),
    "hosts/y.py": ("from attnprune.methods.crisp import _topk\n"
                   "from attnprune.bench._memory import helper\n"
                   "from attnprune.bench import _memory\n"
                   "from . import x as _x\n"),
    "bench/__init__.py": "",
    "bench/_memory.py": "helper = 1\n",
    "bench/a.py": "from attnprune.bench._memory import helper\nfrom attnprune.bench import _memory\n",
}


@pytest.fixture
def planted(tmp_path) -> Path:
    pkg = tmp_path / "attnprune"
    for rel, text in PLANTED.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_the_checks_see_a_host_importing_a_method_module(planted):
    assert host_method_imports(graph(planted)) == [
        "attnprune.hosts.x imports attnprune.methods",
        "attnprune.hosts.x imports attnprune.methods.crisp",
        "attnprune.hosts.y imports attnprune.methods.crisp",
    ]


def test_the_checks_see_a_host_reading_family_facts_from_another_host(planted):
    assert family_imports_elsewhere(planted) == [
        "attnprune/hosts/tok.py:3: from attnprune.hosts.att import family"]


def test_the_checks_see_api_importing_a_client(planted):
    assert api_client_imports(planted) == [
        "api.py:4: imports attnprune.deploy.sentence_transformers",
        "api.py:5: imports sentence_transformers.models",
        "api.py:6: names 'attnprune.deploy.onnx'",
    ]


def test_the_checks_see_a_private_name_imported_from_another_module(planted):
    assert private_imports(planted) == [
        "attnprune/hosts/y.py:1: from attnprune.methods.crisp import _topk",
        "attnprune/hosts/y.py:2: imports attnprune.bench._memory, private to attnprune.bench",
        "attnprune/hosts/y.py:3: imports attnprune.bench._memory, private to attnprune.bench",
    ]


def test_the_checks_see_private_torch_and_transformers_names(planted):
    found = private_api_sites(planted)
    assert not any(s.startswith("compat.py") for s in found)
    assert {int(s.split(":")[1]) for s in found} == set(range(11, 23)) - {13}, found
    for what in ("import torch._dynamo", "from transformers.modeling_utils import _init",
                 "torch…._check", "torch…._is_mkldnn_bf16_supported",
                 "aten…._scaled_dot_product_efficient_attention", "F…._pad",
                 "nn…._global_forward_hooks", "getattr(…, '_is_exporting_flag')", "w…._version",
                 "cls…._from_config", "model…._forward_hooks", "model…._parameters",
                 "model…._buffers", "model…._modules", "'_attn_implementation'",
                 "_output_attentions=…"):
        assert any(s.endswith(": " + what) for s in found), what
