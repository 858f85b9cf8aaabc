"""The machinery of benchmarks/generated_mutants.py, without certifying: the reference's copy imports
as ``gefen_mutant`` without any import of ``gefen_reference`` left in it, one mutation applied by
cosmic-ray changes exactly one file of the copy, and the reference itself is never touched."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "reference" / "gefen_reference"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location(
        "generated_mutants", ROOT / "benchmarks" / "generated_mutants.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while a class is built
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def digests(folder: Path) -> dict:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


@pytest.fixture
def pristine():
    """The reference's files, checked unchanged after the test."""
    before = digests(REFERENCE)
    yield
    assert digests(REFERENCE) == before


def test_copy_imports_as_gefen_mutant_alone(tool, tmp_path, pristine):
    copy = tool.make_copy(tmp_path)
    tool.write_impl_module(tmp_path)
    assert tool.references_left(copy) == []
    assert "from gefen_mutant.codebook import learn_codebook" in (copy / "dcp" / "reblock.py").read_text()
    # same files, same lines: the enumeration over the reference's files addresses the copy's
    assert digests(copy).keys() == digests(REFERENCE).keys()
    for name in digests(copy):
        assert len((copy / name).read_text().splitlines()) == len((REFERENCE / name).read_text().splitlines())
    probe = (
        "import sys, gefen_mutant, gefen_mutant.dcp\n"
        "from gefen_mutant.dcp import optimizer_view\n"
        "assert optimizer_view.supported_class() is gefen_mutant.Gefen\n"
        "left = sorted(m for m in sys.modules if m.split('.')[0] == 'gefen_reference')\n"
        "assert not left, left\n"
        "assert gefen_mutant.__file__.startswith(sys.argv[1]), gefen_mutant.__file__\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_one_mutation_changes_one_file_of_the_copy(tool, tmp_path, pristine):
    config = tmp_path / "one-file.toml"  # the committed configuration, narrowed to one small file
    text = tool.CONFIG.read_text()
    assert 'module-path = "reference/gefen_reference"' in text
    config.write_text(text.replace('"reference/gefen_reference"', '"reference/gefen_reference/codewords.py"'))
    mutations = tool.enumerate_mutations(config)
    assert mutations and {m.file for m in mutations} == {"codewords.py"}
    mutation = next(m for m in mutations if m.operator == "core/ReplaceComparisonOperator_LtE_Lt")

    copy = tool.make_copy(tmp_path / "mutant")
    before = digests(copy)
    old, new = tool.apply(copy, mutation)
    after = digests(copy)
    assert [name for name in before if before[name] != after[name]] == ["codewords.py"]
    assert tool.changed_lines(old, new) == [mutation.line]
    assert tool.brief_diff(old, new) == "if k <= 1: -> if k < 1:"


def test_annotations_are_left_out(tool):
    source = (
        "from __future__ import annotations\n\ndef f(x: int | None = 1 | 2) -> int | None:\n    return x\n"
    )
    spans = tool.annotation_spans(source)
    assert tool.postponed_annotations(source)
    assert sorted(spans) == [((3, 9), (3, 19)), ((3, 32), (3, 42))]  # both annotations
    assert not any(a <= (3, 22) < b for a, b in spans)  # not the default's `1 | 2`
