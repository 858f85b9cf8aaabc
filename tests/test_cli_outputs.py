"""A command that cannot write its output, or has nothing to read, is refused in one line with
exit status 4 before anything runs (SPEC 4.4.10): ``certify --out`` into a
read-only directory (which used to run the whole suite for 220 s, then print an 85-line rank
traceback), ``pytest --impl --certificate`` likewise, ``report --out``, ``golden generate``,
``golden check`` on a missing directory and ``golden compare --impl nosuch``.

A read-only directory is made read-only for real: by permissions for an ordinary user, by a
read-only bind mount in a private mount namespace (``unshare -m``) for root, whom permissions do
not stop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CERTIFICATE = REPO / "certificates" / "fast-0.1.0.json"
ONE_LINE_S = (
    60.0  # refused before anything runs: an interpreter start (slow on a loaded machine), no suite run
)


def _read_only(directory: Path) -> list[str]:
    """A command prefix under which ``directory`` cannot be written (skips where that cannot be had)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return []
    unshare = shutil.which("unshare")
    probe = (
        subprocess.run(
            [
                unshare or "unshare",
                "-m",
                "sh",
                "-c",
                'mount --bind -o ro "$0" "$0" && ! touch "$0/x"',
                str(directory),
            ],
            capture_output=True,
        )
        if unshare
        else None
    )
    if probe is None or probe.returncode != 0:
        pytest.skip("root, and no read-only bind mount here (unshare -m): no directory is read-only for root")
    return [
        unshare,
        "-m",
        "sh",
        "-c",
        'mount --bind -o ro "$0" "$0" && shift && exec "$@"',
        str(directory),
        "--",
    ]


def _run(prefix: list[str], *args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run(prefix + list(args), cwd=cwd, capture_output=True, text=True, timeout=300)
    return result, time.monotonic() - started


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gefen_conformance.cli", *args]


def _assert_refused(result: subprocess.CompletedProcess, elapsed: float, *needles: str) -> None:
    err = result.stderr.strip()
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    assert "Traceback" not in result.stdout + result.stderr
    assert elapsed < ONE_LINE_S, f"took {elapsed:.1f} s: something ran"


@pytest.mark.parametrize(
    "launcher", [["--launcher", "pool"], ["--launcher", "torchrun", "--nproc-per-node", "2"]]
)
def test_certify_into_a_read_only_directory_is_refused_before_anything_runs(tmp_path, launcher):
    locked = tmp_path / "locked"
    locked.mkdir()
    result, elapsed = _run(
        _read_only(locked),
        *_cli("certify", "--impl", "reference", *launcher, "--out", str(locked / "x.json")),
        cwd=tmp_path,
    )
    _assert_refused(result, elapsed, f"--out {locked / 'x.json'}", "cannot write there", str(locked))
    assert not result.stdout.strip()  # pytest never started
    assert not list(tmp_path.glob("**/*.json"))


def test_certify_whose_default_certificate_directory_is_read_only_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    result, elapsed = _run(_read_only(locked), *_cli("certify", "--impl", "reference"), cwd=locked)
    _assert_refused(result, elapsed, "the certificate goes to the current directory", "give --out PATH")


def test_pytest_impl_with_an_unwritable_certificate_is_a_usage_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    result, elapsed = _run(
        _read_only(locked),
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--impl=reference",
        f"--certificate={locked / 'x.json'}",
        cwd=tmp_path,
    )
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"--certificate {locked / 'x.json'}: cannot write there" in result.stderr
    assert "collected" not in result.stdout and elapsed < ONE_LINE_S


def test_a_certificate_path_under_a_file_is_refused(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result, elapsed = _run(
        [], *_cli("certify", "--impl", "reference", "--out", str(blocker / "x.json")), cwd=tmp_path
    )
    _assert_refused(result, elapsed, "is not a directory")


def test_report_into_a_read_only_directory_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    result, elapsed = _run(
        _read_only(locked), *_cli("report", str(CERTIFICATE), "--out", str(locked / "r.html")), cwd=tmp_path
    )
    _assert_refused(result, elapsed, f"--out {locked / 'r.html'}", "cannot write there")


def test_golden_generate_into_a_read_only_directory_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    result, elapsed = _run(
        _read_only(locked), *_cli("golden", "generate", str(locked / "goldens")), cwd=tmp_path
    )
    _assert_refused(result, elapsed, "golden generate", "cannot write there")


def test_golden_check_of_a_missing_directory_is_refused(tmp_path):
    result, elapsed = _run([], *_cli("golden", "check", str(tmp_path / "nowhere")), cwd=tmp_path)
    _assert_refused(result, elapsed, "golden check", "no such directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    result, elapsed = _run([], *_cli("golden", "check", str(empty)), cwd=tmp_path)
    _assert_refused(result, elapsed, "no MANIFEST.json")


def test_golden_compare_with_an_unknown_implementation_is_refused(tmp_path):
    result, elapsed = _run([], *_cli("golden", "compare", "--impl", "nosuch"), cwd=tmp_path)
    _assert_refused(result, elapsed, "--impl=nosuch", "no implementation of that name is registered")
    result, elapsed = _run(
        [], *_cli("golden", "generate", str(tmp_path / "g"), "--impl", "nosuch"), cwd=tmp_path
    )
    _assert_refused(result, elapsed, "--impl=nosuch")
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize("value", ["0", "-2", "soon"])
def test_a_bad_deadline_scale_is_a_usage_error(tmp_path, value):
    result, elapsed = _run(
        [], *_cli("certify", "--impl", "reference", "--deadline-scale", value), cwd=tmp_path
    )
    _assert_refused(result, elapsed, f"--deadline-scale {value}")
    result, _ = _run(
        [],
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--impl=reference",
        f"--gefen-deadline-scale={value}",
        cwd=tmp_path,
    )
    assert result.returncode == 4 and f"--gefen-deadline-scale {value}" in result.stderr


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="no /proc here")
def test_an_output_in_proc_is_refused_in_seconds_even_as_root(tmp_path):
    """Permissions do not stop root, and ``/proc`` answers every permission check; the output is
    tried for real before anything runs."""
    result, elapsed = _run([], *_cli("certify", "--impl", "reference", "--out", "/proc/x.json"), cwd=tmp_path)
    _assert_refused(result, elapsed, "--out /proc/x.json", "cannot write there")
    assert elapsed < 5.0, f"took {elapsed:.1f} s"


def test_missing_parent_directories_of_an_output_are_created(tmp_path):
    from gefen_conformance.certificate import outputs

    target = tmp_path / "a" / "b" / "c.json"
    assert outputs.problem(target) is None
    assert target.parent.is_dir() and list(target.parent.iterdir()) == []  # the probe left nothing
