"""The reference with one piece of its source rewritten: a rule mutant written as the one edit that
breaks its rule (``"mul_(1.0 / bc1)"`` -> ``"mul_(1.0)"``), as a mutation tool writes one.

:func:`mutated_gefen` clones the named modules of ``gefen_reference`` with their edits (each
``old`` text must occur exactly once: an edit that no longer applies fails loudly, never silently
leaving the reference unchanged), then rebuilds every module that imports from a rebuilt one, in
dependency order, so the optimizer class it returns runs the edited code and nothing else differs.
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


def _module(name: str):
    return importlib.import_module(f"{PACKAGE}.{name}")


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


def mutated_gefen(**edits):
    """``gefen_reference.Gefen`` built on modules with ``edits``: ``{module: [(old, new), ...]}``
    (a single ``(old, new)`` pair may stand for its list)."""
    unknown = set(edits) - set(ORDER)
    if unknown:
        raise ValueError(f"not a module of the optimizer: {sorted(unknown)}")
    rebuilt: dict = {}
    for name in ORDER:
        module = _module(name)
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
    return rebuilt["optimizer"].Gefen
