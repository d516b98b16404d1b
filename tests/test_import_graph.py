"""The import graph of ``src/polyturn``: no cycle, and dependencies point down the layers of docs/ARCHITECTURE.md.

Every ``import`` / ``from ... import`` is read with :mod:`ast`, function-local
ones included (a local import hides a cycle from Python, not from this test).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"

#: Layer of each top-level part of the package, lowest first (docs/ARCHITECTURE.md, "Layers"). A module may
#: import its own layer and any lower-ranked one; two layers of the same rank may not import each other.
LAYERS: dict[str, tuple[int, tuple[str, ...]]] = {
    "common": (0, ("polyturn.config", "polyturn.runtime", "polyturn.argtypes", "polyturn.console")),
    "envs": (1, ("polyturn.envs",)),
    "algos": (1, ("polyturn.algos",)),
    "models": (2, ("polyturn.models",)),
    "rollout": (3, ("polyturn.rollout",)),
    "acting": (4, ("polyturn.acting",)),
    "health": (5, ("polyturn.health",)),
    "eval": (6, ("polyturn.eval",)),
    "train": (6, ("polyturn.train",)),
    "serve": (6, ("polyturn.serve",)),
    "cli": (7, ("polyturn.cli", "polyturn.demo", "polyturn")),
}

#: Layers that must never import another, whatever the ranks say: evaluation and training share the health checks
#: one layer down and never import each other; serving needs neither a trainer nor an evaluation.
NEVER: dict[str, tuple[str, ...]] = {"serve": ("health", "eval", "train"), "eval": ("train",), "train": ("eval",)}

#: Third-party modules a layer must never import (the design: environments never import torch).
FORBIDDEN_EXTERNAL = {"envs": ("torch", "transformers", "peft")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports(path: Path, name: str, known: set[str]) -> list[tuple[str, int]]:
    """``(imported name, line)`` for every import in the file; polyturn names resolved to the module imported.

    Imports under ``if TYPE_CHECKING:`` count too: a helper that names its host class only in annotations still
    ties the two modules in a circle (type it against a protocol in a lower module, as train/host.py does).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.append((sub if sub in known else mod, node.lineno))
    return out


def layer_of(module: str) -> str:
    best, best_len = None, -1
    for layer, (_, prefixes) in LAYERS.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = layer, len(p)
    assert best is not None, f"{module} is in no layer: add it to LAYERS and docs/ARCHITECTURE.md"
    return best


def graph() -> tuple[nx.DiGraph, dict[tuple[str, str], int]]:
    mods = modules()
    known = set(mods)
    g = nx.DiGraph()
    g.add_nodes_from(known)
    lines: dict[tuple[str, str], int] = {}
    for name, path in mods.items():
        for target, line in imports(path, name, known):
            if target in known and target != name:
                g.add_edge(name, target)
                lines.setdefault((name, target), line)
    return g, lines


def package_of(module: str) -> str:
    """The sub-package a module belongs to (``polyturn.eval.report`` -> ``polyturn.eval``); top modules are their own."""
    if layer_of(module) == "cli":  # entry points stand above every package
        return module
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_no_module_cycle():
    g, lines = graph()
    cycles = [c for c in nx.simple_cycles(g)]
    shown = ["  " + " -> ".join(c + [c[0]]) for c in cycles[:10]]
    assert not cycles, "Expected no import cycle between modules, got:\n" + "\n".join(shown)


def test_no_package_cycle():
    g, _ = graph()
    pg = nx.DiGraph()
    for a, b in g.edges:
        pa, pb = package_of(a), package_of(b)
        if pa != pb and pa != "polyturn":  # the root package's __init__ sits above everything
            pg.add_edge(pa, pb)
    cycles = list(nx.simple_cycles(pg))
    assert not cycles, f"Expected no import cycle between packages, got {cycles}"


def violation(a: str, b: str) -> str | None:
    """Why the import ``a -> b`` breaks the layers of docs/ARCHITECTURE.md, or None when it is allowed."""
    la, lb = layer_of(a), layer_of(b)
    (ra, _), (rb, _) = LAYERS[la], LAYERS[lb]
    if lb in NEVER.get(la, ()):
        return f"{la} never imports {lb}"
    if la != lb and rb >= ra:
        return f"{la} may not import {lb}"
    return None


def test_dependencies_point_down_the_layers():
    g, lines = graph()
    bad = [f"{a} -> {b} (line {lines[(a, b)]}): {why}" for a, b in sorted(g.edges) if (why := violation(a, b))]
    assert not bad, "Expected imports to point down the layers (docs/ARCHITECTURE.md), got:\n" + "\n".join(bad)


def test_layers_keep_to_their_libraries():
    mods = modules()
    bad = []
    for name, path in mods.items():
        layer = layer_of(name)
        for target, line in imports(path, name, set(mods)):
            top = target.split(".")[0]
            if top in FORBIDDEN_EXTERNAL.get(layer, ()):
                bad.append(f"{name} imports {target} (line {line})")
    assert not bad, f"Expected no torch/transformers in envs, got {bad}"


def test_architecture_doc_states_this_layer_order():
    """docs/ARCHITECTURE.md's layer table lists the layers in the order this test enforces."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*`?([a-z]+)`?\s*\|", text, flags=re.M)
    assert rows, "Expected a '| rank | layer | ...' table in docs/ARCHITECTURE.md"
    assert {layer: int(rank) for rank, layer in rows} == {k: r for k, (r, _) in LAYERS.items()}


@pytest.mark.parametrize("edge", [("polyturn.serve.service", "polyturn.train.trainer"),
                                  ("polyturn.eval.runner", "polyturn.train.setup"),
                                  ("polyturn.acting.registry", "polyturn.eval.records"),
                                  ("polyturn.envs.base", "polyturn.models.actor"),
                                  ("polyturn.serve.cli", "polyturn.eval.policies"),
                                  ("polyturn.train.trainer", "polyturn.eval.diagnose"),
                                  ("polyturn.health.checks", "polyturn.eval.records"),
                                  ("polyturn.serve.service", "polyturn.health.signals"),
                                  ("polyturn.eval.diagnose", "polyturn.cli.diagnose"),
                                  ("polyturn.serve.app", "polyturn.cli")])
def test_the_layer_rule_rejects_upward_edges(edge):
    """The rule itself: an upward, sideways or never-allowed edge of the kinds this refactor removed is refused."""
    assert violation(*edge) is not None
    assert violation("polyturn.train.trainer", "polyturn.health.checks") is None  # and a downward edge is allowed
    assert violation("polyturn.eval.diagnose", "polyturn.health.checks") is None


def test_the_cycle_check_sees_function_local_imports(tmp_path):
    src = "def f():\n    from polyturn.eval import runner\n"
    p = tmp_path / "x.py"
    p.write_text(src)
    assert imports(p, "polyturn.x", {"polyturn.eval.runner"}) == [("polyturn.eval.runner", 2)]


def test_type_only_imports_count_for_cycles(tmp_path):
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from polyturn.train.trainer import Trainer\n"
           "def f():\n    from polyturn.eval import runner\n")
    p = tmp_path / "x.py"
    p.write_text(src)
    known = {"polyturn.train.trainer", "polyturn.eval.runner"}
    ours = sorted(x for x in imports(p, "polyturn.x", known) if x[0].startswith("polyturn"))
    assert ours == [("polyturn.eval.runner", 5), ("polyturn.train.trainer", 3)]
