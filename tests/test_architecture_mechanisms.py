"""docs/architecture.md's "How a host patches a model" lists every way the hosts change a model;
this test counts those sites in ``attnprune/hosts/`` and compares them with the doc's table
(``patch-sites``), so a new hook, a replaced method, a global registration or an attribute
written on a model cannot arrive without the doc saying so (and why)."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

HOSTS = Path(__file__).resolve().parents[1] / "attnprune" / "hosts"
DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
TABLE_ID = "patch-sites"

# Calls that change a model (or are the kit's way to): counted by the called name.
CALLS = frozenset({
    "replace_forward", "replace_method",  # a method replaced by a partial over the state
    "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
    "register_full_backward_pre_hook", "register_backward_hook", "bracket_calls",  # hooks
    "set_attn_implementation",  # the attention-implementation switch
    "add_method_module", "add_module", "register_module",  # an added child module
})


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else ""


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def sites(source: str) -> Counter:
    """The patch sites of one module's source, by kind: the calls in ``CALLS``; ``X.register``
    on a transformers ``…Interface`` (a global registration); ``setattr`` /
    ``object.__setattr__`` of a named attribute (a constant or a ``…_ATTR`` name) on another
    object; assignments to ``…__class__``, ``….forward`` and ``….__dict__[…]`` (not on
    ``self``: a state's own fields are not the model's)."""
    out: Counter = Counter()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name in CALLS:
                out[name] += 1
            elif name == "register" and _name(getattr(node.func, "value", None)).endswith("Interface"):
                out[f"{_name(node.func.value)}.register"] += 1
            elif name in ("setattr", "__setattr__") and len(node.args) >= 2 and not _is_self(node.args[0]):
                attr = node.args[1]
                if isinstance(attr, ast.Constant) or _name(attr).endswith("_ATTR"):
                    out["setattr"] += 1
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Attribute) and t.attr in ("__class__", "forward"):
                    out[f".{t.attr} ="] += 1
                elif (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute)
                      and t.value.attr == "__dict__" and not _is_self(t.value.value)):
                    out["__dict__[…] ="] += 1
    return out


def counted() -> dict[tuple[str, str], int]:
    return {(path.name, kind): n
            for path in sorted(HOSTS.glob("*.py"))
            for kind, n in sites(path.read_text()).items()}


def documented(text: str) -> dict[tuple[str, str], int]:
    """The ``patch-sites`` table of the doc: rows ``| `file` | `site` | count | … |``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"**Source** (`{TABLE_ID}`)"))
    table = {}
    for line in lines[start + 1:]:
        if not line.strip():
            if table:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([^`]+)`", cells[0])
        if m and len(cells) >= 3 and cells[2].isdigit():
            table[(m.group(1), cells[1].strip("`"))] = int(cells[2])
    return table


def test_the_doc_lists_every_patch_site_in_the_hosts():
    """A site added, moved or removed in ``attnprune/hosts/`` without the table fails here:
    the table's (file, site) → count must equal the code's."""
    doc, code = documented(DOC.read_text()), counted()
    missing = {k: n for k, n in code.items() if doc.get(k) != n}
    stale = {k: n for k, n in doc.items() if k not in code}
    assert not missing and not stale, (
        f"docs/architecture.md's `{TABLE_ID}` table is out of date: in the code but not (or "
        f"not so many) in the doc: {missing}; in the doc only: {stale}. Update the table and say "
        f"in the section above why the new site is needed")


def test_the_count_catches_a_planted_site():
    """Each kind of site counts, so planting one is caught (the rule fails on a violation)."""
    planted = (
        "def f(model, state, fn, cache):\n"
        "    model.register_forward_hook(fn)\n"
        "    model.layer.register_forward_pre_hook(fn)\n"
        "    replace_forward(model, fn, state)\n"
        "    replace_method(model, 'encode', fn, state)\n"
        "    AttentionInterface.register('x', fn)\n"
        "    model.set_attn_implementation('x')\n"
        "    model.config.__class__ = type\n"
        "    model.forward = fn\n"
        "    model.__dict__['s'] = state\n"
        "    setattr(cache, KEYS_ATTR, 1)\n"
        "    add_method_module(model, fn)\n"
        "    self.__dict__['own'] = 1\n"  # a state's own field: not a site
    )
    got = sites(planted)
    assert got == Counter({
        "register_forward_hook": 1, "register_forward_pre_hook": 1, "replace_forward": 1,
        "replace_method": 1, "AttentionInterface.register": 1, "set_attn_implementation": 1,
        ".__class__ =": 1, ".forward =": 1, "__dict__[…] =": 1, "setattr": 1,
        "add_method_module": 1})
    doc = documented(DOC.read_text())
    code = counted()
    code[("hf_causal.py", "register_forward_hook")] = code.get(("hf_causal.py", "register_forward_hook"), 0) + 1
    assert any(doc.get(k) != n for k, n in code.items())
