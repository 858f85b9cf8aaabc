"""The reference with one piece of its source rewritten: a rule mutant written as the one edit that
breaks its rule (``"mul_(1.0 / bc1)"`` -> ``"mul_(1.0)"``), as a mutation tool writes one.

:func:`mutated_gefen` clones the named modules of ``gefen_reference`` with their edits (each
``old`` text must occur exactly once: an edit that no longer applies fails loudly, never silently
leaving the reference unchanged), then rebuilds every module that imports from a rebuilt one, in
dependency order, so the optimizer class it returns runs the edited code and nothing else differs.
:func:`mutated_adapter` does the same for the DCP adapter's modules (``gefen_reference.dcp``).
"""

from __future__ import annotations

import ast
import importlib
import inspect

from .mutant_tools import clone

#: The optimizer's modules in dependency order (each imports only from those before it).
ORDER = (
    "codewords",
    "codebook_solver",
    "hyperparameters",
    "naming",
    "periods",
    "codebook",
    "steps",
    "native_state",
    "optimizer",
)
PACKAGE = "gefen_reference"

#: The DCP adapter's modules in dependency order.
ADAPTER_ORDER = (
    "schema",
    "optimizer_view",
    "agreement",
    "hyper_staging",
    "layout",
    "compact",
    "dense",
    "placeholder",
    "reblock",
    "restore",
    "planner",
    "writer",
    "state",
)
ADAPTER_PACKAGE = "gefen_reference.dcp"


def _imports(module) -> dict:
    """``{sibling module: [names bound from it]}`` for the module's relative imports at top level
    (``from .steps import a`` binds ``a`` from ``steps``; ``from . import steps`` binds ``steps``
    itself, recorded under the name ``"."``)."""
    out: dict = {}
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.setdefault(node.module, []).extend((a.name, a.asname or a.name) for a in node.names)
            else:
                for a in node.names:
                    out.setdefault(a.name, []).append((".", a.asname or a.name))
    return out


def _edited(module, edits) -> object:
    source = inspect.getsource(module)
    for old, new in edits:
        count = source.count(old)
        if count != 1:
            raise AssertionError(f"{module.__name__}: {old!r} occurs {count} times, expected once")
        source = source.replace(old, new)
    return clone(module, source)


def _rebuilt(package: str, order: tuple, edits: dict) -> dict:
    """``{module name: its rebuilt copy}`` for the modules of ``package`` (``order``: dependency
    order) that ``edits`` changes, directly or through what they import."""
    unknown = set(edits) - set(order)
    if unknown:
        raise ValueError(f"not a module of {package}: {sorted(unknown)}")
    rebuilt: dict = {}
    for name in order:
        module = importlib.import_module(f"{package}.{name}")
        imports = _imports(module)
        mine = edits.get(name, ())
        if isinstance(mine, tuple) and mine and isinstance(mine[0], str):
            mine = [mine]
        if not mine and not set(imports) & set(rebuilt):
            continue
        copy = _edited(module, mine)
        for source, names in imports.items():
            if source in rebuilt:
                for imported, bound in names:
                    value = rebuilt[source] if imported == "." else getattr(rebuilt[source], imported)
                    setattr(copy, bound, value)
        rebuilt[name] = copy
    return rebuilt


def mutated_gefen(**edits):
    """``gefen_reference.Gefen`` built on modules with ``edits``: ``{module: [(old, new), ...]}``
    (a single ``(old, new)`` pair may stand for its list)."""
    return _rebuilt(PACKAGE, ORDER, edits)["optimizer"].Gefen


def mutated_adapter(**edits):
    """``(GefenDCPState, GefenSavePlanner, GefenFileSystemWriter)`` of the reference's DCP adapter
    built on modules with ``edits`` (as :func:`mutated_gefen`'s)."""
    rebuilt = _rebuilt(ADAPTER_PACKAGE, ADAPTER_ORDER, edits)

    def module(name):
        return rebuilt.get(name) or importlib.import_module(f"{ADAPTER_PACKAGE}.{name}")

    return (
        module("state").GefenDCPState,
        module("planner").GefenSavePlanner,
        module("writer").GefenFileSystemWriter,
    )
