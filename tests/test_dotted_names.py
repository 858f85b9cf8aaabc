"""Every dotted name a docstring or comment gives in double backticks or a Sphinx role
(``:mod:``, ``:func:``, ``:class:``, ...) names something that exists: a name left behind by a
move or a rename sends the reader nowhere."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["conformance", "oracles", "reference", "tests", "examples", "benchmarks", "tools"]
REFERENCE = re.compile(r"(?::(?:mod|func|class|meth|data|attr|exc|obj):`~?|``)([A-Za-z_][\w.]*)")
INSTALLED = ("gefen_conformance", "gefen_oracles", "gefen_reference", "gefen_fast", "gefen_triton")


def resolves(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute path from the longest module prefix of it."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def _prose(path: Path):
    """``(line, text)`` of every docstring and comment of ``path``."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                yield node.body[0].lineno, doc
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def stale_names(paths) -> list[str]:
    out = []
    for path in paths:
        for line, text in _prose(path):
            for match in REFERENCE.finditer(text):
                name = match.group(1).rstrip(".")
                if "." not in name:
                    continue
                top = name.split(".")[0]
                if top in INSTALLED and importlib.util.find_spec(top) is not None and not resolves(name):
                    out.append(f"{path.relative_to(ROOT)}:{line}: {name} does not exist")
    return out


def test_every_dotted_name_in_prose_resolves():
    paths = [
        p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if "egg-info" not in str(p)
    ]
    stale = stale_names(paths)
    assert not stale, "\n".join(stale)


def test_a_stale_name_is_found(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""See :func:`gefen_oracles.kernel_bounds.no_such_bound` and ``gefen_conformance.workload.BA``."""\n'
        "# and :mod:`gefen_oracles.kernel_bounds` exists\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = stale_names([planted])
    finally:
        ROOT = saved
    assert len(found) == 2 and "no_such_bound" in found[0] and "workload.BA " in found[1], found
