"""``gefen-conformance``'s command line explains itself (SPEC 4.4.13, 4.4.9):
certify's usage line did not show `-- PYTEST_ARGS`, an unknown option did not point to `--`, the
torchrun example line was collapsed, "the exit status is pytest's" with no list, CERT, OLD, NEW,
DIR and golden's --impl had no help, no --version, "--nproc-per-node only apply with", and
`--nproc-per-node abc` exited 2 where `0` exited 4.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gefen_conformance
from gefen_conformance import cli
from gefen_conformance.certificate.build import EXIT_STATUS
from gefen_conformance.cli import usage as cli_usage

REPO = Path(__file__).resolve().parents[1]
#: the page that shows the suite's exit statuses (SPEC 4.4.9)
EXIT_STATUS_PAGE = REPO / "docs" / "certificates.md"


def _help(capsys, *words) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main([*words, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def _usage_error(capsys, *words) -> str:
    """The one-line message of a command line refused with exit status 4."""
    try:
        status = cli.main(list(words))
    except SystemExit as stop:  # argparse's own errors
        status = stop.code
    err = capsys.readouterr().err
    assert status == 4, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_certify_help_shows_the_passthrough_test_ids_and_the_exit_status_table(capsys):
    out = _help(capsys, "certify")
    usage = out[: out.index("\n\n")]
    assert "[TEST_ID ...]" in usage and usage.rstrip().endswith("[-- PYTEST_ARGS ...]")
    assert "TEST_ID" in out and "--quiet" in out and "--impl NAME" in out
    for status, _text in cli_usage.suite_statuses():
        assert re.search(rf"^ +{status}  ", out, re.M), status
    for verdict, status in EXIT_STATUS.items():
        assert re.search(rf"^ +{status}  .*{re.escape(verdict)}", out, re.M), verdict
    # the torchrun example keeps its line break
    assert "--device cuda \\\n      --nnodes 2" in out


def test_the_documentation_shows_the_same_exit_status_table():
    assert cli_usage.suite_statuses_markdown() in EXIT_STATUS_PAGE.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "words,arguments",
    [
        (("report",), ["CERT", "--out PATH", "--format"]),
        (("diff",), ["OLD", "NEW", "--margin-factor F", "--margin-threshold F"]),
        (("golden", "generate"), ["DIR", "--impl NAME"]),
        (("golden", "check"), ["DIR"]),
        (("golden", "compare"), ["DIR", "--impl NAME"]),
    ],
)
def test_every_argument_has_help_and_every_command_its_exit_statuses(capsys, words, arguments):
    out = _help(capsys, *words)
    body = out[out.index("\n\n") :]
    for argument in arguments:
        line = next(line for line in body.splitlines() if line.strip().startswith(argument))
        described = (
            line.strip()[len(argument) :].strip()
            or body.splitlines()[body.splitlines().index(line) + 1].strip()
        )
        assert described, f"{argument} has no help:\n{out}"
    assert "exit status:" in out and re.search(r"^ +4  usage error", out, re.M)


def test_top_level_help_and_version(capsys):
    out = _help(capsys)
    assert all(command in out for command in ("certify", "golden", "report", "diff", "--version"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    version = capsys.readouterr().out.strip()
    package = str(Path(gefen_conformance.__file__).parent)
    assert re.fullmatch(r"gefen-conformance \S+ \(.+\)", version) and package in version


@pytest.mark.parametrize(
    "words,needle",
    [
        (("certify", "--nproc-per-node", "abc"), "invalid int value: 'abc'"),
        (
            ("certify", "--launcher", "torchrun", "--nproc-per-node", "0"),
            "--nproc-per-node must be at least 1",
        ),
        (("certify", "--launcher", "mpi"), "invalid choice: 'mpi'"),
        (("report",), "the following arguments are required: CERT"),
        (("diff", "a.json", "b.json", "--margin-factor", "0.5"), "--margin-factor"),
        (("golden", "check"), "the following arguments are required: DIR"),
        (("nosuch",), "invalid choice: 'nosuch'"),
        (("report", "x.json", "--", "-q"), "arguments after `--` are only for `gefen-conformance certify`"),
        (("report", "x.json", "--bogus"), "unrecognized arguments: --bogus"),
    ],
)
def test_every_usage_error_exits_4(capsys, words, needle):
    assert needle in _usage_error(capsys, *words)


def test_argparse_refusals_exit_4_themselves(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["diff", "a.json"])
    assert stop.value.code == 4 and "required: NEW" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--hypothesis-profile=gefen-fuzz", "-k", "-n"])
def test_an_unknown_certify_option_points_to_the_double_dash(capsys, option):
    line = _usage_error(capsys, "certify", "--impl", "reference", option, "4")
    assert line == (
        f"gefen-conformance certify: unrecognized option {option}: pytest's options go after `--` "
        f"(gefen-conformance certify [OPTIONS] [TEST_ID ...] -- {option} ...)"
    )


def test_torchrun_only_options_under_the_pool_say_applies_for_one(capsys):
    line = _usage_error(capsys, "certify", "--nproc-per-node", "2")
    assert line == "gefen-conformance certify: --nproc-per-node only applies with --launcher torchrun"
