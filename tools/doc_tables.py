"""The documentation's generated tables, from the code and the committed certificates.

    python tools/doc_tables.py --check   # exit 1 and name the stale tables
    python tools/doc_tables.py --write   # rewrite them in place

Each table sits in its page (:data:`PAGES`) between ``<!-- BEGIN GENERATED: NAME -->`` and
``<!-- END GENERATED: NAME -->``:

* ``capabilities`` (docs/independent.md): every :class:`gefen_conformance.Capability`, what it
  claims (its docstring entry in ``contract.CAPABILITY_CLAIMS``) and the suite modules whose tests
  it gates (the ``gefen_requires`` marks of ``conformance/suite``, read from the source);
* ``gefenx-expected-failures`` (docs/gefenx.md): gefen-x's declared expected failures
  (``gefen_conformance.implementations.gefenx.EXPECTED_FAILURES``) with the clauses each test names
  in the committed certificate ``certificates/gefenx-0.5.0.json``;
* ``tolerance-profile`` (docs/tolerance.md): every bound of the tolerance profile as the
  certificate states it (``gefen_oracles.numeric.profile_description``, from
  ``gefen_oracles.kernel_bounds``).

The pages are committed with their tables, so that they read whole on a code host and a change of a
capability, an expected failure or a bound shows in review as a change of its table; the site's
build imports neither torch nor the suite's modules for them. tests/test_doc_tables.py fails when a
page is not what ``--write`` would make it.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SUITE = REPO / "conformance" / "gefen_conformance" / "suite"
GEFENX_CERTIFICATE = REPO / "certificates" / "gefenx-0.5.0.json"
COMMAND = "python tools/doc_tables.py --write"
_BLOCK = re.compile(
    r"(<!-- BEGIN GENERATED: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END GENERATED: (?P=name) -->)", re.S
)


def _cell(text) -> str:
    """A table cell: pipes escaped, and asterisks outside code spans, which Markdown would read as
    emphasis (``U*beta1 ... 2U*mag``)."""
    parts = re.split(r"(`[^`]*`)", str(text).replace("|", "\\|").replace("\n", " "))
    return "".join(p if p.startswith("`") else p.replace("*", "\\*") for p in parts)


def _table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def required_by_module(suite: Path = SUITE) -> dict:
    """``{capability tag: [suite module, ...]}``: the modules with a test (or a parametrized case)
    marked ``gefen_requires`` with it, read from the source (nothing is imported or collected)."""
    from gefen_conformance.implementations.contract import Capability

    by_name = {c.name: c.value for c in Capability}
    found: dict = {c.value: set() for c in Capability}
    for module in sorted(suite.glob("test_*.py")):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "gefen_requires"
            ):
                for arg in node.args:
                    name = arg.attr if isinstance(arg, ast.Attribute) else getattr(arg, "id", None)
                    tag = by_name.get(name, arg.value if isinstance(arg, ast.Constant) else None)
                    if tag is None:
                        raise ValueError(
                            f"{module.name}: gefen_requires({ast.unparse(arg)}) names no capability"
                        )
                    found[tag].add(module.name)
    return {tag: sorted(modules) for tag, modules in found.items()}


def capabilities_table() -> str:
    from gefen_conformance.implementations.contract import CAPABILITY_CLAIMS, Capability

    gated = required_by_module()
    rows = []
    for capability in Capability:
        modules = ", ".join(f"`{m}`" for m in gated[capability.value]) or "none"
        rows.append([f"`{capability.value}`", f"`{capability.name}`", CAPABILITY_CLAIMS[capability], modules])
    return _table(["tag", "constant", "claims", "without it, tests of these suite modules are skipped"], rows)


def gefenx_table(certificate: Path = GEFENX_CERTIFICATE) -> str:
    from gefen_conformance.implementations.gefenx import EXPECTED_FAILURES

    tests = {t["id"]: t for t in json.loads(certificate.read_text(encoding="utf-8"))["tests"]}
    rows = []
    for test_id, why in sorted(EXPECTED_FAILURES.items()):
        clauses = (
            ", ".join(str(c) for c in tests.get(test_id, {}).get("clauses", [])) or "(not in the certificate)"
        )
        rows.append([f"`{test_id}`", clauses, why])
    return _table(["suite test", "clauses", "why"], rows)


def _flatten(prefix: str, value, out: list) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), inner, out)
    else:
        out.append((prefix, value))


def tolerance_table() -> str:
    from gefen_oracles.numeric import Profile, profile_description

    described = dict(profile_description(Profile.TOLERANCE))
    described.pop("name")
    described.get("pinned_step", {}).pop(
        "examples_period_64_beta2_0.999", None
    )  # numbers the certificate lists
    bounds = described.pop("bounds", {})
    rows: list = []
    for key, value in described.items():
        _flatten(key, value, rows)
    for name, bound in bounds.items():  # one row per named bound: value, clause, what it bounds
        value = f"{bound['value']:g}" if isinstance(bound["value"], float) else bound["value"]
        rows.append((f"bounds.{name}", f"{value}: {bound['bounds']} (SPEC {bound['clause']})"))
    return _table(
        ["what", "rule or bound"], [[f"`{k}`", f"{v:g}" if isinstance(v, float) else v] for k, v in rows]
    )


TABLES = {
    "capabilities": capabilities_table,
    "gefenx-expected-failures": gefenx_table,
    "tolerance-profile": tolerance_table,
}

#: the page that holds each table
PAGES = {
    "capabilities": DOCS / "independent.md",
    "gefenx-expected-failures": DOCS / "gefenx.md",
    "tolerance-profile": DOCS / "tolerance.md",
}


def tables_of(page: Path) -> list:
    """The names of the tables ``page`` holds."""
    return [name for name, held_by in PAGES.items() if held_by == page]


def render(text: str, names) -> str:
    """``text`` with every generated block replaced by what the code makes of it now; each table of
    ``names`` must have its block there."""
    seen = set()

    def replace(match):
        name = match.group("name")
        if name not in TABLES:
            raise ValueError(f"unknown generated table {name!r} (known: {', '.join(TABLES)})")
        seen.add(name)
        return match.group(1) + TABLES[name]() + match.group(4)

    out = _BLOCK.sub(replace, text)
    missing = sorted(set(names) - seen)
    if missing:
        raise ValueError(f"no generated block for {', '.join(missing)}")
    return out


def stale(text: str, names) -> list:
    """The names of the tables of ``names`` whose text in ``text`` differs from the code's (or is
    missing)."""
    current = {m.group("name"): m.group("body") for m in _BLOCK.finditer(text)}
    return sorted(name for name in names if current.get(name) != TABLES[name]())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the generated tables of the pages")
    action.add_argument("--check", action="store_true", help="exit 1 when a generated table is stale")
    args = parser.parse_args(argv)
    status = 0
    for page in sorted(set(PAGES.values())):
        rel = page.relative_to(REPO)
        text = page.read_text(encoding="utf-8")
        if args.write:
            new = render(text, tables_of(page))
            if new != text:
                page.write_text(new, encoding="utf-8")
            print(f"{rel}: tables " + ("rewritten" if new != text else "already current"))
            continue
        names = stale(text, tables_of(page))
        if names:
            print(f"{rel}: stale generated tables: {', '.join(names)} (run {COMMAND})", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
