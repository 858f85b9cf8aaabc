"""SPEC 4.1.7: certifying from a kernel repository whose root holds its own ``reference``,
``conformance`` and ``oracles`` packages, a root ``conftest.py`` that imports them and a ``tests/``
package with a ``conftest.py``, and a configuration that imports test modules with pytest's
``importlib`` mode (the other runs use the default, ``prepend``), gives the same results as
certifying from an empty directory (every
selected test passes, the certificate names this suite; under torchrun, a slow case, compared with a
run from an empty directory); and the suite's fixtures do not leak into that repository's tests.

The user's packages are booby-trapped: any of their modules the suite imported by mistake
raises, and their ``__init__`` defines nothing the suite looks for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: One test of each kind the suite has: an in-process optimizer test, a multi-rank scenario (rank
#: bodies travel by name into the ranks) and a hypothesis property.
# (-k cannot name a parameter id with ">": the reshard "2->1" that "and 2-1" meant never matched, so no
# multi-rank scenario ran here; the async refusal is one on 2 ranks)
SELECTION = (
    "global_step or test_async_save_with_the_default_writer_is_refused_before_writing or "
    "staging_regression and lr-requires"
)


def _kernel_repository(root: Path) -> Path:
    root.mkdir()
    for package in ("reference", "conformance", "oracles"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text(f"WHO = 'the user\\'s {package}'\n")
        for module in ("workload", "plugin", "optimizer", "numeric", "dcp", "suite", "implementations"):
            (root / package / f"{module}.py").write_text(
                f"raise ImportError('the suite imported the user\\'s {package}.{module}')\n"
            )
    (root / "conftest.py").write_text("import conformance, oracles, reference  # the user's own\n")
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "conftest.py").write_text("import reference\n")
    (root / "tests" / "test_theirs.py").write_text(
        "import pytest\n\n"
        "def test_no_suite_fixture_here(request):\n"
        "    for name in ('impl', 'impl_spec', 'saved', 'one_rank', 'gefen_impl', 'gefen_reference', "
        "'gefen_ranks', 'gefen_checkpoints', 'gefen_one_rank'):\n"
        "        with pytest.raises(pytest.FixtureLookupError):\n"
        "            request.getfixturevalue(name)\n"
    )
    (root / "pytest.ini").write_text("[pytest]\ntestpaths = tests\naddopts = --import-mode=importlib\n")
    return root


def _certify(cwd: Path, *launcher: str) -> dict:
    cert = cwd / "out" / "certificate.json"
    cert.parent.mkdir(exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "gefen_conformance.cli",
        "certify",
        "--impl",
        "reference",
        *launcher,
        "--out",
        str(cert),
        "--",
        "-q",
        "-p",
        "no:cacheprovider",
        "-k",
        SELECTION,
    ]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900)
    partial = cert.with_name("certificate.partial.json")
    found = cert if cert.exists() else partial
    assert found.exists(), (
        f"no certificate (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return json.loads(found.read_text())


def _results(cert: dict) -> list:
    return sorted((t["id"], t["outcome"]) for t in cert["tests"])


#: The suite tests SELECTION picks (ids without parameters).
SELECTED = {
    "test_optimizer.py::test_global_step_counts_every_step_call",
    "test_dcp_async.py::test_async_save_with_the_default_writer_is_refused_before_writing",
    "test_hyper_staging.py::test_staging_regression",
}


@pytest.mark.parametrize(
    "launcher",
    [
        # a partial certification (20 s of a 2-core machine, nearly all its start): .ci/run runs it
        pytest.param((), id="pool", marks=pytest.mark.slow),
        pytest.param(
            ("--launcher", "torchrun", "--nproc-per-node", "2"), id="torchrun", marks=pytest.mark.slow
        ),
    ],
)
def test_a_repository_with_packages_of_the_same_names_certifies_like_an_empty_directory(tmp_path, launcher):
    """From the kernel repository the selection runs, every test of it passes (as it does from any
    directory: the suite's own runs prove that) and the certificate names this installed suite; the
    slow torchrun case also certifies from an empty directory and compares the two."""
    from gefen_conformance.certificate.build import suite_facts

    theirs = _kernel_repository(tmp_path / "kernel-repo")
    got = _certify(theirs, *launcher)
    results = _results(got)
    assert results and all(outcome == "passed" for _, outcome in results), results
    assert {test_id.partition("[")[0] for test_id, _ in results} == SELECTED
    assert got["verdict"] == "partial"  # -k
    assert got["suite"]["content_sha256"] == suite_facts(git=False)["content_sha256"]
    if launcher:
        empty = tmp_path / "empty"
        empty.mkdir()
        expected = _certify(empty, *launcher)
        assert results == _results(expected)
        assert got["verdict"] == expected["verdict"]
        assert got["suite"]["content_sha256"] == expected["suite"]["content_sha256"]


def test_the_repositorys_own_tests_see_none_of_the_suites_fixtures(tmp_path):
    theirs = _kernel_repository(tmp_path / "kernel-repo")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=theirs,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
