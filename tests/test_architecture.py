"""The tree tells the architecture (docs/architecture.md): layers import downwards only, no
import circle and a small top level.

The graph is read from the source (every ``import`` statement, function-level ones included),
so a lazy import that crosses a layer is caught as well as a top-level one."""

import ast
import re
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
    "attnprune.methods": ("attnprune.methods", "attnprune.selection", "attnprune.attention"),
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


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The attnprune modules ``path`` imports (``from pkg import sub`` counts as ``pkg.sub``
    when that is a module, else as ``pkg``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        found.update(t for t in targets if t == "attnprune" or t.startswith("attnprune."))
    return found


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


PRIVATE = re.compile(r"\._attn_implementation\b|[\"']_attn_implementation[\"']|\._forward_hooks\b|"
                     r"\._forward_pre_hooks\b|\._modules\b|torch\.ops\.aten\._")


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


def test_private_torch_and_transformers_names_only_in_the_compat_module():
    """Private names (``config._attn_implementation``, ``module._forward_hooks`` /
    ``_forward_pre_hooks`` / ``_modules``, aten's ``_scaled_dot_product_*``) are reached through
    ``attnprune/compat.py`` alone, which says which versions it was checked against."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "compat.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if PRIVATE.search(code) and "``" not in code:
                found.append(f"{rel}:{n}: {line.strip()}")
    assert found == []
