"""SPEC.md's clause ids, and where the project cites them (for tests/test_spec_agreement.py).

A clause is defined by a numbered heading (``### 1.8 Block-vmean step``) or by a paragraph that
opens with its number inside its section (``1.8.3 The second moment ...``). A citation is
``SPEC 1.8.3``, ``§1.8.3``, an id in a ``gefen_clause(...)`` marker, or the rule id a row of the
suite's rule-example tables names (``Stepped("1.13.9", ...)``: its test is marked with it).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)+)[ .]")
_PARAGRAPH = re.compile(r"^(\d+\.\d+\.\d+(?:\.\d+)?) ")
_CITED = re.compile(r"(?:SPEC|§)\s*§?(\d+(?:\.\d+)+)")
_MARKER = re.compile(r"clause\(([^)]*)\)")
_MARKER_ID = re.compile(r"[\"'](\d+(?:\.\d+)*)[\"']")
#: A row of a rule-example table (an example type called with its rule id first:
#: ``Stepped("1.13.9", ...)``, ``DcpLoadRefused("3.4.1", ...)``): its rule id's clause.
_EXAMPLE_ROW = re.compile(r"\b[A-Z][A-Za-z]*\(\s*\"(\d+\.\d+\.\d+)(?:#\d+)?\"")


def defined(spec: Path = REPO / "SPEC.md") -> dict:
    """``{clause id: line number}`` of every clause SPEC defines."""
    found, section = {}, None
    for number, line in enumerate(spec.read_text(encoding="utf-8").splitlines(), 1):
        heading = _HEADING.match(line)
        if heading:
            section = heading.group(1)
            found[section] = number
            continue
        paragraph = _PARAGRAPH.match(line)
        if paragraph and section and paragraph.group(1).startswith(section + "."):
            found[paragraph.group(1)] = number
    return found


def citations(paths) -> dict:
    """``{clause id: sorted files}`` cited in ``paths`` (files or folders, ``.py`` and ``.md``)."""
    cited: dict = {}
    for path in paths:
        path = path if Path(path).is_absolute() else REPO / path
        path = Path(path)
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in (".py", ".md"))
        for file in files:
            if "__pycache__" in file.parts or ".egg-info" in str(file):
                continue
            text = file.read_text(encoding="utf-8")
            ids = {m.group(1).rstrip(".") for m in _CITED.finditer(text)}
            ids |= {c for m in _MARKER.finditer(text) for c in _MARKER_ID.findall(m.group(1))}
            ids |= {m.group(1) for m in _EXAMPLE_ROW.finditer(text)}
            for clause in ids:
                cited.setdefault(clause, set()).add(str(file.relative_to(REPO)))
    return {c: sorted(files) for c, files in cited.items()}


def covers(cited_id: str, clause: str) -> bool:
    """A citation covers a clause when it names the clause, one of its sub-clauses, or the section
    that holds it (a test of "1.8" checks the block step's every stage)."""
    return cited_id == clause or cited_id.startswith(clause + ".") or clause.startswith(cited_id + ".")
