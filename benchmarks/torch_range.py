"""Which torch versions the suite and the reference support: measured, one fresh venv per version.

    python benchmarks/torch_range.py [--venvs DIR] [--ref REF] [--keep] [--skip-tests] VERSION [VERSION ...]

The repository at REF (default HEAD) is exported once (``git archive``) into a temporary
directory, so the measurement is of one commit whatever happens to the work tree meanwhile. For
each VERSION, in DIR/torch-VERSION (default DIR: /work/venvs; never inside the repository):

1. a fresh virtualenv; ``pip install torch==VERSION`` (pip's configured indexes: PyPI and the
   machine's local wheel directories; PyPI's Linux wheels pull NVIDIA's CUDA libraries, a few GB);
2. ``pip install <the export>[test]``, not editable;
3. the reference's certification in an empty directory:
   ``python -m pytest -p no:cacheprovider --impl=reference --certificate=cert.json``;
4. the project's tests from the export: ``python -m pytest -q -n 2 -p no:cacheprovider``.

One line of results per version is appended to benchmarks/torch_range.results.txt (and printed);
the full logs go to DIR/logs. The venv is deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "torch_range.results.txt"


def _run(command, log: Path, cwd=None, env=None, timeout=3600) -> tuple[int, float, str]:
    started = time.monotonic()
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(map(str, command))}\n")
        out.flush()
        try:
            # Ctrl-C as in a terminal, even when this script runs as a background job (SIGINT ignored)
            proc = subprocess.run(
                command,
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
            text, code = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as error:
            text, code = (
                (error.stdout or b"").decode(errors="replace")
                if isinstance(error.stdout, bytes)
                else (error.stdout or ""),
                -1,
            )
        out.write(text)
    return code, time.monotonic() - started, text


def _tail_counts(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return lines[-1].strip("= ") if lines else "(no summary line)"


def export(ref: str, into: Path) -> str:
    """``git archive REF`` unpacked into ``into``; returns the commit."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def one_version(version: str, venvs: Path, keep: bool, skip_tests: bool, source: Path) -> dict:
    venv = venvs / f"torch-{version}"
    logs = venvs / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"torch-{version}.log"
    log.write_text(f"torch {version}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    if venv.exists():
        shutil.rmtree(venv)
    python = venv / "bin" / "python"
    row = {"torch": version}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    steps = [
        ([sys.executable, "-m", "venv", str(venv)], "venv"),
        ([str(python), "-m", "pip", "install", "-q", f"torch=={version}"], "torch"),
        ([str(python), "-m", "pip", "install", "-q", f"{source}[test]"], "project"),
    ]
    for command, what in steps:
        code, seconds, _ = _run(command, log, env=env)
        if code != 0:
            row["install"] = f"{what} failed (exit {code})"
            return row
    row["install"] = "ok"
    row["venv_gb"] = round(sum(f.stat().st_size for f in venv.rglob("*") if f.is_file()) / 1e9, 1)
    code, _, text = _run([str(python), "-c", "import torch; print(torch.__version__)"], log, env=env)
    row["torch_build"] = text.strip().splitlines()[-1] if code == 0 else "import failed"

    with tempfile.TemporaryDirectory(prefix="gefen-range-") as empty:
        code, seconds, text = _run(
            [
                str(python),
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "--impl=reference",
                "--certificate=cert.json",
            ],
            log,
            cwd=empty,
            env=env,
            timeout=3600,
        )
        cert_path = Path(empty) / "cert.json"
        cert = json.loads(cert_path.read_text()) if cert_path.exists() else None
    row["certification"] = {
        "exit": code,
        "seconds": round(seconds),
        "verdict": cert["verdict"] if cert else None,
        "summary": cert["summary"] if cert else None,
        "failed": [t["id"] for t in cert["tests"] if t["outcome"] in ("failed", "error")][:30]
        if cert
        else [],
        "notes": cert["notes"] if cert else [],
    }
    if not skip_tests:
        code, seconds, text = _run(
            [str(python), "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider"],
            log,
            cwd=source,
            env=env,
            timeout=7200,
        )
        failed = sorted({m for m in re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)})
        row["project_tests"] = {
            "exit": code,
            "seconds": round(seconds),
            "result": _tail_counts(text),
            "failed": failed[:30],
        }
    if not keep:
        shutil.rmtree(venv, ignore_errors=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("versions", nargs="+")
    parser.add_argument("--venvs", type=Path, default=Path("/work/venvs"))
    parser.add_argument("--keep", action="store_true", help="keep the venvs")
    parser.add_argument("--skip-tests", action="store_true", help="only the certification")
    parser.add_argument("--ref", default="HEAD", help="the commit to measure (default HEAD)")
    args = parser.parse_args(argv)
    if args.venvs.resolve().is_relative_to(REPO):
        parser.error("put the venvs outside the repository")
    source = Path(tempfile.mkdtemp(prefix="gefen-range-src-"))
    commit = export(args.ref, source)
    load = os.getloadavg()
    for version in args.versions:
        row = one_version(version, args.venvs, args.keep, args.skip_tests, source)
        row["commit"] = commit[:12]
        row["load_at_end"] = round(os.getloadavg()[0], 1)
        row["load_at_start"] = round(load[0], 1)
        line = json.dumps(row)
        print(line, flush=True)
        with open(RESULTS, "a") as out:
            out.write(line + "\n")
        load = os.getloadavg()
    shutil.rmtree(source, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
