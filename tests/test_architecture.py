"""ARCHITECTURE.md's import rules, checked on the source (every import statement, module level or
inside a function, read with ``ast``): each rule there has an id (``I1`` ...) and a check here, and
the two lists are the same."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"reference": "gefen_reference", "conformance": "gefen_conformance", "oracles": "gefen_oracles"}
C = "gefen_conformance"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)[1:]  # the folder holds the package
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    """``{module name: path}`` of the three packages (the golden data holds no Python)."""
    return {
        _module_name(p): p
        for folder, package in PACKAGES.items()
        for p in sorted((ROOT / folder / package).rglob("*.py"))
    }


MODULES = _modules()


def _imports(name: str, path: Path, modules=MODULES) -> set:
    """Every module ``name`` imports: ``from X import a`` counts as ``X.a`` where that is a module,
    else as ``X``; an import of a module's own package (Python's package loading) is not counted."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                out.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
    return {m for m in out if not (name == m or name.startswith(m + "."))}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _ours(target: str, modules=MODULES) -> str | None:
    """The module of the three packages ``target`` is (or lies in), None for anything else."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violations(importers, allowed=None, forbidden=(), exact=("gefen_conformance",)) -> list[str]:
    """Imports of the modules under ``importers`` that leave ``allowed`` (prefixes; None: anything)
    or enter ``forbidden`` (prefixes), among the three packages and gefen-x (``gefen``). The
    modules in ``exact`` (the top-level ``gefen_conformance``, whose names are its public API) are
    allowed themselves wherever ``allowed`` is given, but not what lies under them."""
    out = []
    for name, targets in sorted(GRAPH.items()):
        if not _within(name, importers):
            continue
        for target in sorted(targets):
            ours = _ours(target) or (target if _within(target, ["gefen"]) else None)
            if ours is None:
                continue
            if (
                allowed is not None
                and ours not in exact
                and not _within(ours, list(importers) + list(allowed))
            ) or _within(ours, forbidden):
                out.append(f"{name} imports {target}")
    return out


RULES = {
    "I1": lambda: _violations(["gefen_reference"], allowed=[], exact=()),
    "I2": lambda: _violations(["gefen_oracles"], allowed=[], exact=()),
    "I3": lambda: _violations([f"{C}.implementations"], allowed=["gefen_reference", "gefen"]),
    "I4": lambda: _violations([f"{C}.harness"], allowed=[f"{C}.implementations", f"{C}.exit_codes"]),
    "I5": lambda: _violations(
        [f"{C}.workload"],
        allowed=[f"{C}.harness", f"{C}.implementations", "gefen_oracles", "gefen_reference"],
    ),
    "I6": lambda: _violations([f"{C}.judging"], allowed=["gefen_oracles"]),
    "I7": lambda: _violations(
        [f"{C}.certificate"],
        forbidden=[f"{C}.{m}" for m in ("plugin", "suite", "workload", "judging", "golden", "repro", "cli")],
    ),
    "I8": lambda: _violations(
        [f"{C}.suite"], forbidden=[f"{C}.{m}" for m in ("plugin", "certificate", "cli", "repro")]
    ),
    "I9": lambda: _violations([f"{C}.plugin"], forbidden=[f"{C}.cli", f"{C}.repro"]),
    "I10": lambda: [" -> ".join(cycle) for cycle in _cycles()],
    "I11": lambda: _example_violations(),
    "I12": lambda: _violations([f"{C}.exit_codes"], allowed=[], exact=()),
}


def _cycles() -> list:
    """The import cycles among the modules (strongly connected components of more than one)."""
    graph = {n: {_ours(t) for t in ts} - {None, n} for n, ts in GRAPH.items()}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _example_violations() -> list[str]:
    """An example backend's own package imports the suite only through its top-level names."""
    out = []
    for path in sorted((ROOT / "examples").glob("*/gefen_*/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                if name.startswith(f"{C}.") or name.startswith("gefen_oracles"):
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    return out


def _stated_rules() -> dict:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    return dict(re.findall(r"^- \*\*(I\d+)\*\*\s+(.+)$", text, re.M))


def test_architecture_states_exactly_the_rules_checked_here():
    assert set(_stated_rules()) == set(RULES), sorted(set(_stated_rules()) ^ set(RULES))


@pytest.mark.parametrize("rule", sorted(RULES, key=lambda r: int(r[1:])))
def test_import_rule_holds(rule):
    violations = RULES[rule]()
    assert not violations, f"{rule} ({_stated_rules().get(rule, '?')}):\n" + "\n".join(violations)


def test_the_checks_find_a_planted_violation(tmp_path):
    """The graph and the rules catch an import they forbid, a relative one included."""
    planted = tmp_path / "conformance" / "harness" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(
        "from ..plugin import hooks\n\ndef f():\n    import gefen_conformance.suite.checkpoints\n"
    )
    modules = dict(MODULES, **{"gefen_conformance.harness.planted": planted})
    found = _imports("gefen_conformance.harness.planted", planted, modules)
    assert {"gefen_conformance.plugin.hooks", "gefen_conformance.suite.checkpoints"} <= found
    GRAPH["gefen_conformance.harness.planted"] = found
    try:
        assert len(RULES["I4"]()) == 2
    finally:
        del GRAPH["gefen_conformance.harness.planted"]


def test_every_module_is_reached_by_the_rules():
    """No module of the three packages falls outside the layers the rules name."""
    layers = defaultdict(list)
    for name in MODULES:
        parts = name.split(".")
        layers[".".join(parts[:2]) if parts[0] == C else parts[0]].append(name)
    named = {
        "gefen_reference",
        "gefen_oracles",
        C,
        *(
            f"{C}.{m}"
            for m in ("implementations", "harness", "workload", "judging", "certificate", "suite", "plugin")
        ),
        *(f"{C}.{m}" for m in ("cli", "golden", "repro", "vectors")),  # the command line and its library
        f"{C}.exit_codes",
    }
    assert set(layers) <= named, sorted(set(layers) - named)
