"""ARCHITECTURE.md's import rules are import-linter contracts in pyproject.toml (``[tool.importlinter]``),
one a rule, each named by its rule's id (``I1`` ...). Here: ``lint-imports`` keeps every contract on
the source, the document and the contracts name the same rules, and each contract breaks on an import
planted against it in a copy of the source.

Every rule is a contract. I1-I9 and I11 are ``forbidden`` contracts; I10 (no import cycle between
modules) is the one rule no built-in contract type states: ``acyclic_siblings`` squashes each sibling
package into one node, so it also refuses two packages that import each other through different
modules (``certificate.report_cli`` imports ``cli_usage``, which imports ``certificate.build``),
which is no cycle between modules. I10's contract is of the type ``acyclic_modules``,
``tools/import_contracts.py``, registered through import-linter's ``contract_types``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = {
    "reference": "gefen_reference",
    "conformance": "gefen_conformance",
    "oracles": "gefen_oracles",
}
EXAMPLE_PACKAGES = sorted(ROOT.glob("examples/*/gefen_*/__init__.py"))
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACT_LINE = re.compile(r"^(I\d+) .* (KEPT|BROKEN)\b", re.M)


def _rule_id(contract: dict) -> str:
    return contract["name"].split()[0]


def _lint(root: Path) -> tuple[int, str]:
    """``lint-imports`` on the tree at ``root`` with its pyproject.toml: its exit status and report.
    The three packages and the example backends are found by their folders under ``root``."""
    folders = [*PACKAGE_FOLDERS, *(p.parent.parent.relative_to(ROOT) for p in EXAMPLE_PACKAGES)]
    path = [root / folder for folder in folders]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in path), COLUMNS="1000", NO_COLOR="1")
    run = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]
        + ["--config", str(root / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return run.returncode, run.stdout + run.stderr


def _stated_rules() -> list[str]:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    return re.findall(r"^- \*\*(I\d+)\*\*\s", text, re.M)


def test_the_import_contracts_hold():
    status, report = _lint(ROOT)
    results = dict(CONTRACT_LINE.findall(report))
    assert status == 0 and results and set(results.values()) == {"KEPT"}, report


def test_architecture_states_exactly_the_rules_the_contracts_check():
    """One contract a rule, in the document's order."""
    assert [_rule_id(c) for c in CONFIG["contracts"]] == _stated_rules()


def test_every_example_backend_is_held_to_I11():
    """I11 names every example backend's own package (``examples/*/gefen_*``), and each is linted."""
    (i11,) = [c for c in CONFIG["contracts"] if _rule_id(c) == "I11"]
    names = [p.parent.name for p in EXAMPLE_PACKAGES]
    assert names and sorted(i11["source_modules"]) == names
    assert set(names) <= set(CONFIG["root_packages"])


def test_I13_names_every_suite_test_module():
    """I13 forbids each suite test module by name (a contract's module expressions wildcard whole
    names only): the list is the suite's ``test_*.py`` files. Its sources are the other root
    packages, and ``gefen_conformance``'s and the suite's modules one by one."""
    (i13,) = [c for c in CONFIG["contracts"] if _rule_id(c) == "I13"]
    suite = ROOT / "conformance" / "gefen_conformance" / "suite"
    tests = sorted(f"gefen_conformance.suite.{p.stem}" for p in suite.glob("test_*.py"))
    assert tests and sorted(i13["forbidden_modules"]) == tests
    others = [p for p in CONFIG["root_packages"] if p != "gefen_conformance"]
    assert sorted(i13["source_modules"]) == sorted(
        [*others, "gefen_conformance.*", "gefen_conformance.suite.*"]
    )


# One import a rule forbids, planted in a copy of the source: {rule: (file, text)}. Imports inside a
# function and relative imports count as any other.
PLANTED = {
    "I1": ("reference/gefen_reference/planted_i1.py", "def f():\n    import gefen_oracles\n"),
    "I2": ("oracles/gefen_oracles/planted_i2.py", "import gefen_reference\n"),
    "I3": ("conformance/gefen_conformance/implementations/planted_i3.py", "from ..harness import launch\n"),
    "I4": ("conformance/gefen_conformance/harness/planted_i4.py", "from ..plugin import hooks\n"),
    "I5": ("conformance/gefen_conformance/workload/planted_i5.py", "from gefen_conformance import judging\n"),
    "I6": ("conformance/gefen_conformance/judging.py", "\n\ndef planted_i6():\n    import gefen_reference\n"),
    "I7": ("conformance/gefen_conformance/certificate/planted_i7.py", "import gefen_conformance.golden\n"),
    "I8": ("conformance/gefen_conformance/suite/planted_i8.py", "from ..certificate import build\n"),
    "I9": ("conformance/gefen_conformance/plugin/planted_i9.py", "import gefen_conformance.repro\n"),
    "I10": ("oracles/gefen_oracles/planted_i10.py", "from gefen_oracles import planted_i10_back\n"),
    "I11": (
        "examples/gefen-fast/gefen_fast/planted_i11.py",
        "from gefen_conformance.implementations import contract\n",
    ),
    "I12": (
        "conformance/gefen_conformance/exit_codes.py",
        "\n\ndef planted_i12():\n    from . import judging\n",
    ),
    "I13": ("conformance/gefen_conformance/suite/planted_i13.py", "from . import test_optimizer\n"),
}
PLANTED_I10_BACK = ("oracles/gefen_oracles/planted_i10_back.py", "from gefen_oracles import planted_i10\n")


def _copy_source(to: Path) -> None:
    """The Python files of the packages, the example backends' packages and the contracts."""
    python_only = shutil.ignore_patterns("__pycache__", "*.egg-info", "golden", "csrc")
    for init in [ROOT / f / p / "__init__.py" for f, p in PACKAGE_FOLDERS.items()] + EXAMPLE_PACKAGES:
        package = init.parent
        shutil.copytree(package, to / package.relative_to(ROOT), ignore=python_only)
    for name in ("pyproject.toml", "tools/import_contracts.py"):
        (to / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, to / name)


def test_each_contract_breaks_on_an_import_planted_against_its_rule(tmp_path):
    assert sorted(PLANTED) == sorted(_stated_rules())
    _copy_source(tmp_path)
    for name, text in [*PLANTED.values(), PLANTED_I10_BACK]:
        with open(tmp_path / name, "a") as f:
            f.write(text)
    status, report = _lint(tmp_path)
    assert status != 0 and dict(CONTRACT_LINE.findall(report)) == dict.fromkeys(PLANTED, "BROKEN"), report
    # each contract's section of the report names its planted module
    sections = re.split(r"^(?=I\d+ .*\n-+$)", report.partition("Broken contracts")[2], flags=re.M)
    by_rule = {s.split()[0]: s for s in sections if s.strip()}
    for rule, (name, _) in PLANTED.items():
        module = ".".join(Path(name).with_suffix("").parts[-2:])
        assert module in by_rule[rule], f"{rule} does not name {module}:\n{by_rule[rule]}"


def test_every_module_lies_in_a_layer_the_architecture_names():
    """No module of the three packages falls outside the layers the rules and the picture name."""
    layers = set()
    for folder, package in PACKAGE_FOLDERS.items():
        for path in (ROOT / folder / package).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            layers.add(".".join(parts[:2]) if package == "gefen_conformance" else package)
    conformance = (
        "__init__",
        "exit_codes",
        "implementations",
        "harness",
        "workload",
        "judging",
        "certificate",
        "suite",
    )
    command_line = ("cli", "golden", "repro", "vectors")
    named = {
        "gefen_reference",
        "gefen_oracles",
        *(f"gefen_conformance.{m}" for m in conformance + ("plugin",) + command_line),
    }
    assert layers <= named, sorted(layers - named)
