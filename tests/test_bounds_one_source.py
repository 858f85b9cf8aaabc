"""One source for every bound (SPEC 5.3.4, 5.6): every numeric tolerance the suite applies is
defined in ``gefen_oracles.kernel_bounds``, named there with its clause, and stated in the
certificate's profile; no other judging module defines one.

The rules read the source (``ast``), so they hold for code paths no test happens to run:

* no module but ``kernel_bounds`` uses the unit roundoff ``U`` (every bound is built from it);
* no module-level or class-level constant with a tolerance's name (``*BOUND*``, ``*RTOL*``,
  ``*ATOL*``, ``*TOL*``, ``*MAX_ABS*``, ``*SLACK*``, ``*ALLOW*``, ``*ROUNDING*``) holds a number;
* no call passes a number as ``rtol``, ``atol``, ``bound`` or ``tolerance``;
* no comparison in an oracle holds a float other than 0 or +-1 against a computed value;
* every numeric constant of ``kernel_bounds`` is in its ``STATED`` table, and every stated bound
  reaches the certificate's ``profile`` with its value and clause.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

from gefen_oracles import kernel_bounds
from gefen_oracles.numeric import profile_description

ROOT = Path(__file__).resolve().parents[1]
#: Where implementations are judged: the oracles, the suite, the workloads, the goldens, repro.
JUDGING = [
    *sorted((ROOT / "oracles" / "gefen_oracles").glob("*.py")),
    *sorted((ROOT / "conformance" / "gefen_conformance" / "suite").glob("*.py")),
    *sorted((ROOT / "conformance" / "gefen_conformance" / "workload").glob("*.py")),
    ROOT / "conformance" / "gefen_conformance" / "golden.py",
    ROOT / "conformance" / "gefen_conformance" / "repro.py",
]
JUDGING = [p for p in JUDGING if p.name != "kernel_bounds.py"]
TOLERANCE_NAME = re.compile(r"BOUND|RTOL|ATOL|(^|_)TOL(_|$)|TOLERANCE|MAX_ABS|SLACK|ALLOW|ROUNDING")
TOLERANCE_KEYWORDS = {"rtol", "atol", "bound", "tolerance"}


def _is_number(node: ast.AST) -> bool:
    """A literal number, or arithmetic of literal numbers (``1.0 / 255``, ``2**-24``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    return False


def _is_float(node: ast.AST) -> bool:
    """A number written as a float (counts and structural sizes are integers)."""
    return _is_number(node) and any(
        isinstance(n, ast.Constant) and isinstance(n.value, float) for n in ast.walk(node)
    )


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        where = f"{_relative(path)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Name) and node.id == "U":
            out.append(f"{where}: uses the unit roundoff U")
        elif isinstance(node, ast.Attribute) and node.attr == "U":
            out.append(f"{where}: uses the unit roundoff .U")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Name)
                    and TOLERANCE_NAME.search(target.id)
                    and node.value is not None
                    and _is_number(node.value)
                ):
                    out.append(f"{where}: defines the tolerance {target.id}")
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg in TOLERANCE_KEYWORDS and _is_number(keyword.value):
                    out.append(f"{where}: passes a number as {keyword.arg}=")
        elif isinstance(node, ast.Compare) and path.parent.name == "gefen_oracles":
            for side in [node.left, *node.comparators]:
                if _is_float(side) and abs(eval(ast.unparse(side))) not in (0.0, 1.0):
                    out.append(f"{where}: compares against the number {ast.unparse(side)}")
    return out


def test_no_judging_module_defines_a_tolerance():
    findings = [f for path in JUDGING for f in _findings(path)]
    assert not findings, "\n".join(findings)


@pytest.mark.parametrize(
    "source,finding",
    [
        ("CONTINUATION_BOUND = 5e-3\n", "defines the tolerance CONTINUATION_BOUND"),
        ("x = 2 * kb.U * y\n", "uses the unit roundoff .U"),
        ("c = relative_comparison('w', e, a, rtol=1e-5)\n", "passes a number as rtol="),
    ],
)
def test_the_rules_find_a_tolerance_defined_elsewhere(tmp_path, source, finding):
    module = tmp_path / "oracles" / "gefen_oracles" / "planted.py"
    module.parent.mkdir(parents=True)
    module.write_text(source)
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert any(finding in f for f in _findings(module)), _findings(module)
    finally:
        ROOT = saved


def _numeric_constants() -> dict:
    tables = {"U", "UNIT_ROUNDOFF", "SIGNIFICAND_BITS", "STATED"}
    return {
        name: value
        for name, value in vars(kernel_bounds).items()
        if name.isupper() and name not in tables and isinstance(value, (int, float))
    }


def test_every_bound_is_stated_with_its_clause():
    constants = _numeric_constants()
    assert set(constants) == set(kernel_bounds.STATED), set(constants) ^ set(kernel_bounds.STATED)
    for name, (clause, profiles, what) in kernel_bounds.STATED.items():
        assert re.fullmatch(r"5\.\d+(\.\d+)?", clause), (name, clause)
        assert set(profiles) <= {"torch-exact", "tolerance"} and profiles and what, name


@pytest.mark.parametrize("profile", ["torch-exact", "tolerance"])
def test_the_certificate_profile_states_every_bound_it_applies(profile):
    described = profile_description(profile)["bounds"]
    for name, (clause, profiles, _) in kernel_bounds.STATED.items():
        if profile in profiles:
            value = getattr(kernel_bounds, name)
            assert described[name]["clause"] == clause and math.isclose(described[name]["value"], value), name
        else:
            assert name not in described, name
