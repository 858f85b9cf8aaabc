"""Whether the declared dependency floors work together: measured, one fresh venv per combination.

    python benchmarks/dependency_floors.py [--venvs DIR] [--ref REF] [--keep] [--tests]
                                           [--pin NAME==VERSION ...] [COMBINATION ...]

COMBINATION is ``floors`` or ``newest`` (default: both, in that order):

* ``floors``: the lowest versions pyproject.toml admits (torch 2.7.0, pytest 8.1.1,
  hypothesis 6.100.0, safetensors 0.4.1, ml_dtypes 0.4.0, jinja2 3.0, jsonschema 4.0.1) and
  pytest-xdist 3.0.2, the oldest release that runs under pytest 8.0 (the 1.x and 2.x releases
  declare ``pytest>=...`` with no upper bound, but those tried, 1.25.0 to 2.5.0, import
  ``py.log``, which pytest 8 no longer provides, and fail at ``-n 2``; ``pip check`` passes all
  the same, the ``py`` dependency being undeclared); numpy is unpinned
  (pyproject.toml sets no floor and torch 2.7.0 declares no numpy requirement), so pip picks the
  newest it can;
* ``newest``: the newest release pip finds of each, except torch 2.13.0, which pip takes from
  the machine's local CPU wheel (an unpinned torch from PyPI is a multi-GB CUDA build).

``--pin NAME==VERSION`` (repeatable) replaces one package's pin in every combination run, to
bisect one package's releases: ``--pin pytest==8.1.1 floors``.

The repository at REF (default HEAD) is exported once (``git archive``) into a temporary
directory, so the measurement is of one commit whatever happens to the work tree meanwhile. For
each combination, in DIR/deps-NAME (default DIR: /work/venvs; never inside the repository):

1. a fresh virtualenv; ``pip install torch==X pytest==Y pytest-xdist==Z hypothesis==W numpy ...``
   (pip's configured indexes: PyPI and the machine's local wheel directories; PyPI's Linux torch
   wheels pull NVIDIA's CUDA libraries, a few GB);
2. ``pip install --no-deps <the export>`` after that, so pip cannot upgrade a pinned floor;
3. ``pip check``, its output recorded (it says whether the pins satisfy the declared ranges);
4. the reference's certification in an empty directory,
   ``python -m pytest -p no:cacheprovider --impl=reference --certificate=cert.json``, once in
   one process and once with ``-n 2`` (xdist);
5. with ``--tests`` only (slow): the project's tests from the export,
   ``python -m pytest -q -n 2 -p no:cacheprovider``.

One JSON line of results per combination is appended to benchmarks/dependency_floors.results.txt
(and printed): the commit, the pins, the versions ``pip freeze`` reports, ``pip check``'s output,
each certification's verdict, summary, failed ids (with the first reasons) and seconds, the load
average at start and end. The full logs go to DIR/logs. The venv is deleted afterwards unless
``--keep``.
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
RESULTS = REPO / "benchmarks" / "dependency_floors.results.txt"

#: The packages pinned per combination; None: unpinned, the newest pip finds.
PINNED = (
    "torch",
    "pytest",
    "pytest-xdist",
    "hypothesis",
    "numpy",
    "safetensors",
    "ml_dtypes",
    "jinja2",
    "jsonschema",
)
COMBINATIONS = {
    "floors": {
        "torch": "2.7.0",
        "pytest": "8.1.1",
        "pytest-xdist": "3.0.2",
        "hypothesis": "6.100.0",
        "numpy": None,
        "safetensors": "0.4.1",
        "ml_dtypes": "0.4.0",
        "jinja2": "3.0.0",
        "jsonschema": "4.0.1",
    },
    "newest": {
        "torch": "2.13.0",
        "pytest": None,
        "pytest-xdist": None,
        "hypothesis": None,
        "numpy": None,
        "safetensors": None,
        "ml_dtypes": None,
        "jinja2": None,
        "jsonschema": None,
    },
}
#: What the results record from ``pip freeze``: the pinned packages and the two the runner rests on.
RECORDED = (*PINNED, "pluggy", "execnet")


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
            out_text = error.stdout or ""
            text = out_text.decode(errors="replace") if isinstance(out_text, bytes) else out_text
            code = -1
        out.write(text)
    return code, time.monotonic() - started, text


def _tail_counts(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return lines[-1].strip("= ") if lines else "(no summary line)"


def _last_lines(text: str, count: int = 8) -> list[str]:
    return [line[:300] for line in text.strip().splitlines()[-count:]]


def resolve(ref: str) -> str | None:
    """The commit REF names, or None if it names none."""
    proc = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def export(commit: str, into: Path) -> None:
    """``git archive COMMIT`` unpacked into ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def requirements(pins: dict) -> list[str]:
    return [name if version is None else f"{name}=={version}" for name, version in pins.items()]


def frozen(python: Path, log: Path, env) -> dict:
    """The recorded packages' versions as ``pip freeze`` prints them (None: not installed)."""
    code, _, text = _run([str(python), "-m", "pip", "freeze"], log, env=env)
    found = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)$", line.strip())
        if match:
            found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return {name: found.get(name) for name in RECORDED}


def certify(python: Path, log: Path, env, extra: list[str]) -> dict:
    """The reference's certification in an empty directory, with ``extra`` pytest arguments."""
    with tempfile.TemporaryDirectory(prefix="gefen-floors-") as empty:
        code, seconds, text = _run(
            [
                str(python),
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "--impl=reference",
                "--certificate=cert.json",
                *extra,
            ],
            log,
            cwd=empty,
            env=env,
            timeout=3600,
        )
        cert_path = Path(empty) / "cert.json"
        cert = json.loads(cert_path.read_text()) if cert_path.exists() else None
    result = {"args": extra, "exit": code, "seconds": round(seconds)}
    if cert is None:
        # no certificate: what pytest said last is the only evidence of why
        result.update(verdict=None, summary=None, failed=[], output_tail=_last_lines(text))
        return result
    failed = [t for t in cert["tests"] if t["outcome"] in ("failed", "error")]
    result.update(
        verdict=cert["verdict"],
        summary=cert["summary"],
        failed=[t["id"] for t in failed][:30],
        reasons={t["id"]: str(t.get("reason") or "")[:400] for t in failed[:5]},
        notes=cert.get("notes", []),
    )
    return result


def one_combination(name: str, pins: dict, venvs: Path, keep: bool, tests: bool, source: Path) -> dict:
    venv = venvs / f"deps-{name}"
    logs = venvs / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"deps-{name}.log"
    log.write_text(f"{name} {pins}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    if venv.exists():
        shutil.rmtree(venv)
    python = venv / "bin" / "python"
    row = {"combination": name, "pins": pins, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [str(python), "-m", "pip"]
    steps = [
        ([sys.executable, "-m", "venv", str(venv)], "venv"),
        ([*pip, "install", "-q", *requirements(pins)], "pins"),
        # after the pins and without dependencies, so that pip cannot move a pinned floor
        ([*pip, "install", "-q", "--no-deps", str(source)], "project"),
    ]
    started = time.monotonic()
    for command, what in steps:
        code, _, text = _run(command, log, env=env)
        if code != 0:
            row["install"] = f"{what} failed (exit {code})"
            row["install_tail"] = _last_lines(text)
            row["installed"] = frozen(python, log, env) if python.exists() else {}
            if not keep:
                shutil.rmtree(venv, ignore_errors=True)
            return row
    row["install"] = "ok"
    row["install_seconds"] = round(time.monotonic() - started)
    row["installed"] = frozen(python, log, env)
    code, _, text = _run([*pip, "check"], log, env=env)
    row["pip_check"] = {"exit": code, "output": text.strip().splitlines()}
    row["venv_gb"] = round(sum(f.stat().st_size for f in venv.rglob("*") if f.is_file()) / 1e9, 1)
    code, _, text = _run([str(python), "-c", "import torch; print(torch.__version__)"], log, env=env)
    row["torch_build"] = text.strip().splitlines()[-1] if code == 0 else "import failed"

    row["certification"] = certify(python, log, env, [])
    row["certification_xdist"] = certify(python, log, env, ["-n", "2"])
    if tests:
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


def _pin(text: str) -> tuple[str, str]:
    match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", text)
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None
    if name not in PINNED:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME==VERSION, NAME one of {', '.join(PINNED)}")
    return name, match.group(2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "combinations",
        nargs="*",
        metavar="COMBINATION",
        help=f"one of {', '.join(COMBINATIONS)} (default: all)",
    )
    parser.add_argument("--venvs", type=Path, default=Path("/work/venvs"))
    parser.add_argument("--keep", action="store_true", help="keep the venvs")
    parser.add_argument("--tests", action="store_true", help="also run the project's tests (slow)")
    parser.add_argument("--ref", default="HEAD", help="the commit to measure (default HEAD)")
    parser.add_argument(
        "--pin",
        type=_pin,
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="replace one package's pin in the combinations run (repeatable)",
    )
    args = parser.parse_args(argv)
    names = args.combinations or list(COMBINATIONS)
    unknown = [name for name in names if name not in COMBINATIONS]
    if unknown:
        parser.error(f"unknown combination {', '.join(unknown)}: choose from {', '.join(COMBINATIONS)}")
    if args.venvs.resolve().is_relative_to(REPO):
        parser.error("put the venvs outside the repository")
    commit = resolve(args.ref)
    if commit is None:
        parser.error(f"--ref {args.ref!r} names no commit in {REPO}")
    overrides = dict(args.pin)
    source = Path(tempfile.mkdtemp(prefix="gefen-floors-src-"))
    try:
        export(commit, source)
        for name in names:
            load = os.getloadavg()
            pins = {**COMBINATIONS[name], **overrides}
            row = one_combination(name, pins, args.venvs, args.keep, args.tests, source)
            row["commit"] = commit[:12]
            row["load_at_start"] = round(load[0], 1)
            row["load_at_end"] = round(os.getloadavg()[0], 1)
            line = json.dumps(row)
            print(line, flush=True)
            with open(RESULTS, "a") as out:
                out.write(line + "\n")
    finally:
        shutil.rmtree(source, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
