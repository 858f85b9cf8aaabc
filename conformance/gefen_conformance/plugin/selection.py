"""Which suite tests a run selected, and whether it ran the whole suite (SPEC 4.4.2).

Only a run that executed every test of the suite can be certified ``conformant``. What the whole
suite is, is decided by collecting it in a separate pytest process with nothing but the suite's
own settings (:class:`SuiteCensus`): the user's ``-k``, ``-m``, ``--deselect``, ``--lf``,
``--ignore``, node ids, ``python_files`` and plugins cannot change that count. The census costs a
few seconds of one core and runs alongside the tests; it is skipped when the run is already known
to be narrowed (``-k``/``-m``/``--deselect`` removed suite tests), where the count of suite tests
collected before deselection serves.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
SUITE_DIR = PACKAGE_DIR / "suite"
CENSUS_ENV = "GEFEN_CONFORMANCE_CENSUS"
CENSUS_TIMEOUT_S = 300.0

WHOLE, ABOVE, NARROWER, OUTSIDE = "whole", "above", "narrower", "outside"


def suite_id(nodeid: str) -> str:
    """``test_module.py::test_name[params]``: the id expected-failure lists and certificates use."""
    path, sep, rest = nodeid.partition("::")
    return path.replace("\\", "/").rsplit("/", 1)[-1] + sep + rest


def item_id(item) -> str:
    """A collected suite item's :func:`suite_id`, from its file name: pytest leaves the path out of
    the node id of a module named directly on the command line outside the rootdir."""
    return suite_id(Path(str(item.path)).name + "::" + item.nodeid.partition("::")[2])


def suite_path_for(arg: str, invocation_dir: Path) -> str | None:
    """``arg`` rewritten to an absolute suite path when it is a suite id (``test_module.py`` with
    or without ``::test...``) and no such file exists where pytest runs; None otherwise."""
    target, sep, rest = arg.partition("::")
    if "/" in target or "\\" in target or not (target.startswith("test_") and target.endswith(".py")):
        return None
    if (Path(invocation_dir) / target).exists() or not (SUITE_DIR / target).is_file():
        return None
    return str(SUITE_DIR / target) + sep + rest


def in_suite(path) -> bool:
    return Path(str(path)).resolve().is_relative_to(SUITE_DIR)


def arg_scope(arg: str, invocation_dir: Path, pyargs: bool) -> str:
    """How much of the suite one command-line argument names: WHOLE (the suite or its package, by
    path or with ``--pyargs``), ABOVE (a directory the suite lies in), NARROWER (a suite module, a
    node id, a subdirectory) or OUTSIDE."""
    target, _, node = arg.partition("::")
    if pyargs and target and "/" not in target and not target.endswith(".py"):
        if target in ("gefen_conformance", "gefen_conformance.suite"):
            return NARROWER if node else WHOLE
        if target.startswith("gefen_conformance.suite."):
            return NARROWER
        if target.startswith("gefen_conformance."):
            return OUTSIDE
    path = Path(target) if Path(target).is_absolute() else Path(invocation_dir) / target
    try:
        path = path.resolve()
    except OSError:
        return OUTSIDE
    if path in (SUITE_DIR, PACKAGE_DIR):
        return NARROWER if node else WHOLE
    if SUITE_DIR.is_relative_to(path):
        return ABOVE
    if path.is_relative_to(SUITE_DIR):
        return NARROWER
    return OUTSIDE


def display_id(arg: str, pyargs: bool) -> str:
    """A narrowing argument as a suite id: ``test_module.py[::test...]``."""
    target, sep, rest = arg.partition("::")
    if pyargs and target.startswith("gefen_conformance.suite."):
        target = target.rsplit(".", 1)[-1] + ".py"
    return suite_id(target + sep + rest)


def names_the_suite(args, invocation_dir: Path, pyargs: bool) -> bool:
    """True when the command line asks for (part of) the suite by name, not by walking into it."""
    return any(arg_scope(a, invocation_dir, pyargs) in (WHOLE, NARROWER) for a in args)


def narrower_args(args, invocation_dir: Path, pyargs: bool) -> list[str]:
    """The arguments that select only part of the suite (node ids, modules)."""
    return [a for a in args if arg_scope(a, invocation_dir, pyargs) == NARROWER]


def _plugin_args() -> list[str]:
    """``-p`` for the plugin where the census's pytest would not load it by itself: the plugin's
    ``pytest11`` entry point is not installed (a run from a checkout with ``-p``), or plugin
    autoloading is off."""
    from importlib.metadata import entry_points

    module = "gefen_conformance.plugin.hooks"
    if not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") and any(
        ep.value == module for ep in entry_points(group="pytest11")
    ):
        return []
    return ["-p", module]


class SuiteCensus:
    """The ids of every test of the whole suite, collected in a separate pytest process."""

    def __init__(self, tier: str = "default") -> None:
        self.tier = tier  # the run's tier (SPEC 4.3.16): the whole suite is that tier's
        self.ids: list[str] | None = None
        self.error: str | None = None
        self._process: subprocess.Popen | None = None
        self._tmp: str | None = None

    @staticmethod
    def wanted() -> bool:
        return not os.environ.get(CENSUS_ENV)

    def start(self) -> None:
        if self._process is not None or self.ids is not None:
            return
        self._tmp = tempfile.mkdtemp(prefix="gefen-census-")
        ini = Path(self._tmp) / "pytest.ini"
        ini.write_text("[pytest]\n")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
        env[CENSUS_ENV] = "1"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(ini),
            "--rootdir",
            self._tmp,
            *_plugin_args(),
            "--impl=reference",
            f"--gefen-tier={self.tier}",
            str(SUITE_DIR),
        ]
        try:
            self._process = subprocess.Popen(
                command,
                cwd=self._tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        except OSError as error:
            self.error = f"could not start the census: {error}"
            self._cleanup()

    def finish(self, timeout: float = CENSUS_TIMEOUT_S) -> list[str] | None:
        """The suite's test ids (None, with :attr:`error` set, when the census failed)."""
        if self._process is None:
            return self.ids
        from gefen_conformance.harness.deadlines import wall_bound

        try:
            out, _ = self._process.communicate(timeout=wall_bound(timeout))
        except subprocess.TimeoutExpired:
            self.cancel()
            self.error = f"the census did not finish within {timeout:g} s"
            return None
        code, self._process = self._process.returncode, None
        self._cleanup()
        ids = [
            suite_id(line.strip()) for line in out.splitlines() if "::" in line and not line.startswith(" ")
        ]
        if code != 0 or not ids:
            tail = " | ".join(out.strip().splitlines()[-3:])
            self.error = f"collecting the whole suite failed (exit {code}): {tail[:300]}"
            return None
        self.ids = ids
        return ids

    def cancel(self) -> None:
        if self._process is not None:
            self._process.kill()
            try:
                self._process.communicate(timeout=10)
            except (subprocess.TimeoutExpired, OSError, ValueError):
                pass
            self._process = None
        self._cleanup()

    def _cleanup(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
