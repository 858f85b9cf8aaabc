"""The plugin's command-line options and their checks before anything runs (SPEC 4.1.5, 4.1.6,
4.2.10, 4.4.10, 4.6.1).

:func:`add` registers the ``--impl`` family in every pytest session (nothing else of the plugin
acts unless the suite runs). The checks run from ``pytest_load_initial_conftests`` when the suite
runs: each bad value is one usage error naming the option, raised before the suite's modules are
imported (exit 4).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

from gefen_conformance.exit_codes import ExitCode

#: The suite's tiers (SPEC 4.3.16): each runs every test of the tiers before it.
TIERS = ("default", "scale")

#: the run's interrupt guard (``gefen_conformance.plugin.interrupts.InterruptGuard``), in the config's stash
GUARD_KEY = pytest.StashKey[object]()


def add(parser) -> None:
    """The ``--impl`` family: the only options the plugin adds to every pytest session (SPEC 4.1.5)."""
    group = parser.getgroup("gefen-conformance", "Gefen conformance suite")
    group.addoption(
        "--impl",
        default=None,
        help="run the conformance suite against this implementation: a registered name or "
        "package.module:attribute (without paths: the whole suite, from any directory)",
    )
    group.addoption("--impl-list", action="store_true", help="list the registered implementations and exit")
    group.addoption(
        "--golden-regen",
        action="store_true",
        help="rewrite the committed golden checkpoints from the reference, then fail the run",
    )
    # not plain --device: this plugin loads in every pytest session of its environment, and a
    # project whose conftest adds its own --device would then not start (argparse conflict)
    group.addoption(
        "--gefen-device",
        dest="gefen_device",
        default="cpu",
        metavar="NAME",
        help="where the implementation's tensors live: cpu (default), cuda, cuda:N or any torch "
        "device type; the reference runs on CPU, and a non-CPU device is judged by the "
        "tolerance profile (gefen-conformance certify --device NAME passes it on)",
    )
    group.addoption(
        "--gefen-tier",
        dest="gefen_tier",
        default=None,
        choices=TIERS,
        help="which tier of the suite runs (SPEC 4.3.16): default, or scale (the default tier and "
        "parameters and runs the size of real models; minutes and a few GiB of memory). Default: "
        "scale on a non-CPU device, default on CPU",
    )
    group.addoption(
        "--gefen-deadline-scale",
        dest="gefen_deadline_scale",
        default=None,
        metavar="F",
        help="multiply every deadline of the rank harness by F (> 0; default 1). Deadlines already "
        "stretch with the machine's measured load (SPEC 4.2.10); F is for what load does not "
        "show: a much slower CPU, an emulator, a sanitizer build",
    )
    group.addoption(
        "--certificate",
        default=None,
        metavar="PATH",
        help="where to write the JSON certificate (default: ./gefen-certificate-<impl>.json; "
        "a run that is not complete never replaces a complete certificate)",
    )
    group.addoption(
        "--gefen-shard",
        dest="gefen_shard",
        default=None,
        metavar="I/N",
        help="run only shard I of N (1 <= I <= N) of the selected suite tests: a deterministic "
        "partition by test id; merge the shards' certificates with `gefen-conformance merge`",
    )
    group.addoption(
        "--gefen-junit",
        dest="gefen_junit",
        default=None,
        metavar="FILE",
        help="also write the certificate as JUnit XML, each test with its clauses and worst margin",
    )
    group.addoption(
        "--expectations",
        default=None,
        metavar="FILE",
        help="a TOML file of the tests this implementation is expected to fail (strict xfail) or skip, "
        "each under conditions on device, torch version, launcher and world size (SPEC 4.4.14)",
    )


def prepare(config, *, impl: str, deadline_scale, certificate, device: str, resolved=None):
    """Every check of the run's options, in the order a failure is reported, then the
    implementation: ``(implementation, interrupt guard)``. Given ``resolved`` (the implementation
    the early check already loaded in this process), the certificate path is not checked again
    and the implementation is not resolved again."""
    installed = guard(config)
    select_deadline_scale(deadline_scale, installed)
    if resolved is None:
        check_certificate_path(config, certificate, installed)
    load_expectations(config, config.getoption("expectations", None), installed)
    check_shard(config.getoption("gefen_shard", None), installed)
    if resolved is None:
        check_output(config.getoption("gefen_junit", None), "--gefen-junit", config, installed)
        check_implementation(impl, installed)
    with _interrupt_says("while importing torch", installed, config):
        select_device(device, installed)
    if resolved is not None:
        return resolved, installed
    with _interrupt_says(f"while loading the implementation {impl!r}", installed, config):
        return resolve(impl, installed), installed


def suite_ids_as_paths(args, namespace, invocation_dir) -> None:
    """A test id as the suite prints it (``test_dcp_async.py::test_x[p]``, SPEC 4.5.5) names that
    suite test from any directory: rewritten to the suite module's path, unless the current
    directory holds a file of that name."""
    from gefen_conformance.plugin.selection import suite_path_for

    for i, arg in enumerate(namespace.file_or_dir):
        path = suite_path_for(arg, Path(invocation_dir))
        if path is not None:
            args[:] = [path if a == arg else a for a in args]
            namespace.file_or_dir[i] = path


def guard(config):
    """The run's interrupt guard, installed before anything heavy is imported: a Ctrl-C that lands
    in a callback of an import (hypothesis registers a garbage-collector callback) is not lost."""
    from gefen_conformance.plugin.interrupts import InterruptGuard

    installed = config.stash.get(GUARD_KEY, None)
    if installed is None:
        installed = config.stash[GUARD_KEY] = InterruptGuard()
        installed.install()
    return installed


def select_device(name: str, guard) -> None:
    """``--gefen-device NAME`` checked on this machine and made the run's device (SPEC 4.6.1); a
    device it does not have is a usage error naming it."""
    from gefen_conformance.harness import devices

    try:
        devices.select(devices.parse(name))
    except devices.DeviceUnavailable as error:
        guard.uninstall()
        raise pytest.UsageError(f"--gefen-device {error}") from None


@contextlib.contextmanager
def _interrupt_says(when: str, guard, config):
    """A Ctrl-C before the session exists (pytest would print the whole import traceback) is one
    line naming what was interrupted, exit 2, and the process leaves at once (SPEC 4.4.6: the
    finalization of a half-imported torch took over a second at load)."""
    try:
        yield
    except KeyboardInterrupt:
        from gefen_conformance.plugin.interrupts import leave_process, say_interrupted

        guard.uninstall()
        capture = config.pluginmanager.get_plugin("capturemanager")
        if capture is not None:  # pytest's capture holds the streams until the options are checked
            capture.suspend_global_capture(in_=True)
            out, err = capture.read_global_capture()
            sys.stdout.write(out)
            sys.stderr.write(err)
        say_interrupted(when)
        status = int(ExitCode.INTERRUPTED)
        leave_process(status, is_worker=hasattr(config, "workerinput"))
        raise SystemExit(status) from None  # pytest.main() called by another program


#: the run's expectations (``gefen_conformance.certificate.expectations.Expectations``), in the config's stash
EXPECTATIONS_KEY = pytest.StashKey[object]()


def load_expectations(config, path, guard) -> None:
    """``--expectations FILE`` read and checked before anything runs: one usage error naming the
    file and the entry (SPEC 4.4.14)."""
    if path is None or EXPECTATIONS_KEY in config.stash:
        return
    from gefen_conformance.certificate import expectations

    try:
        config.stash[EXPECTATIONS_KEY] = expectations.load(path)
    except expectations.ExpectationsError as error:
        guard.uninstall()
        raise pytest.UsageError(f"--expectations {error}") from None


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)``; ValueError naming what is wrong."""
    index, slash, count = str(text).partition("/")
    if not slash or not index.isdigit() or not count.isdigit() or not 1 <= int(index) <= int(count):
        raise ValueError(f"{text!r} is not I/N with 1 <= I <= N")
    return int(index), int(count)


def tier(config) -> str:
    """The run's tier (SPEC 4.3.16): ``--gefen-tier``, else ``scale`` on a non-CPU device (a GPU
    certification always runs it) and ``default`` on CPU."""
    chosen = config.getoption("gefen_tier", None)
    if chosen is not None:
        return chosen
    from gefen_conformance.harness import devices

    return "default" if devices.selected().type == "cpu" else "scale"


def in_tier(test_tier: str, run_tier: str) -> bool:
    """Whether a test of ``test_tier`` belongs to a run of ``run_tier`` (a tier holds those before it)."""
    return TIERS.index(test_tier) <= TIERS.index(run_tier)


def check_shard(text, guard) -> None:
    if text is None:
        return
    try:
        parse_shard(text)
    except ValueError as error:
        guard.uninstall()
        raise pytest.UsageError(f"--gefen-shard {error}") from None


def check_output(path, option: str, config, guard) -> None:
    """Another output the run writes, tried before anything runs (SPEC 4.4.10)."""
    if path is None or hasattr(config, "workerinput"):
        return
    from gefen_conformance.certificate import outputs

    why = outputs.problem(Path(path))
    if why:
        guard.uninstall()
        raise pytest.UsageError(f"{option} {path}: {why}")


def check_certificate_path(config, path, guard) -> None:
    """A certificate that could not be written is refused before anything runs (SPEC 4.4.10): one
    line, exit 4. xdist workers write none."""
    if hasattr(config, "workerinput"):
        return
    from gefen_conformance.certificate import outputs

    target = Path(path) if path else Path.cwd() / "gefen-certificate.json"
    why = outputs.problem(target)
    if why:
        guard.uninstall()
        where = f"--certificate {path}" if path else f"the certificate (default: in {Path.cwd()})"
        raise pytest.UsageError(f"{where}: {why}")


def select_deadline_scale(text, guard) -> None:
    """``--gefen-deadline-scale F`` checked and made this process's (SPEC 4.2.10)."""
    if text is None:
        return
    from gefen_conformance.harness import deadlines

    try:
        deadlines.set_scale(deadlines.parse_scale(text))
    except ValueError as error:
        guard.uninstall()
        raise pytest.UsageError(f"--gefen-deadline-scale {text}: {error}") from None


def check_implementation(spec: str, guard) -> None:
    """An unknown name or a package this process cannot find, refused before torch is imported."""
    from gefen_conformance.implementations import registry

    try:
        registry.check(spec)
    except registry.ImplementationError as error:
        guard.uninstall()
        raise pytest.UsageError(f"--impl={spec}: {error}") from None


def resolve(spec: str, guard):
    """The implementation ``--impl`` names; every way it fails to load is a usage error (SPEC 4.1.6)."""
    from gefen_conformance.implementations import registry

    try:
        return registry.resolve(spec)
    except registry.ImplementationError as error:
        guard.uninstall()
        raise pytest.UsageError(f"--impl={spec}: {error}") from None
