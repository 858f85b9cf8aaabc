"""The example workflow of a kernel repository (examples/ci/certify-backend.yml, docs/ci.md
"Publishing and gating CI"): every ``gefen-conformance`` command it runs is one the installed
command line accepts, and the files it uploads are the ones those commands write (SPEC 4.4.14-4.4.16,
4.5.1, 4.5.3, 4.5.7)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from gefen_conformance import cli
from gefen_conformance.certificate import build

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / "examples" / "ci" / "certify-backend.yml"
VALUES = {"IMPL": "fast", "SUITE": "gefen-conformance==0.1.0", "EXPECTATIONS": "e.toml", "matrix.shard": "1"}


def _steps() -> list[dict]:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    return [step for job in jobs.values() for step in job["steps"]]


def _expand(line: str) -> str:
    line = re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: VALUES.get(m.group(1), m.group(1)), line)
    return re.sub(r"\$(\w+)", lambda m: VALUES.get(m.group(1), m.group(0)), line)


def commands() -> list[list[str]]:
    """Each ``gefen-conformance`` command line of the workflow's ``run`` scripts, split as the
    shell would, without what follows ``||``, ``>`` or ``|``."""
    out = []
    for step in _steps():
        script = step.get("run", "").replace("\\\n", " ")
        for line in script.splitlines():
            line = line.strip()
            if not line.startswith("gefen-conformance "):
                continue
            line = re.split(r"\s(?:\|\||>>?|\|)\s", _expand(line))[0]
            out.append(shlex.split(line)[1:])
    return out


def test_the_workflow_runs_certify_merge_verify_report_and_diff():
    used = [c[0] for c in commands()]
    assert {"certify", "merge", "verify", "report", "diff"} <= set(used)


@pytest.mark.parametrize("argv", commands(), ids=lambda argv: " ".join(argv)[:60])
def test_every_command_of_the_workflow_is_one_the_command_line_accepts(argv):
    try:
        args = cli.build_parser().parse_args(argv)
    except SystemExit as exit_:
        pytest.fail(f"gefen-conformance {' '.join(argv)}: refused (exit {exit_.code})")
    assert callable(getattr(args, "handler", None)) or args.command == "certify"


def test_the_shard_step_accepts_exactly_the_partial_status_besides_success():
    script = next(s["run"] for s in _steps() if "--shard" in s.get("run", ""))
    allowed = {int(n) for n in re.findall(r"\$status -eq (\d+)", script)}
    assert allowed == {0, build.EXIT_STATUS[build.Verdict.PARTIAL]}


def test_the_uploads_name_the_files_the_commands_write():
    uploaded = " ".join(
        s["with"]["path"] for s in _steps() if s.get("uses", "").startswith("actions/upload-artifact")
    )
    for argv in commands():
        for option in ("--out", "--junit"):
            if option in argv and argv[0] in ("certify", "merge", "report"):
                written = argv[argv.index(option) + 1].replace("fast", "${{ env.IMPL }}", 1)
                plain = argv[argv.index(option) + 1].replace("1", "${{ matrix.shard }}")
                assert written in uploaded or plain in uploaded, (option, argv)
    # a failing shard's reproducers lie beside its certificate (SPEC 4.5.6)
    assert "shard-${{ matrix.shard }}.repro/" in uploaded
