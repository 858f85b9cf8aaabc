"""Building mutants without touching the reference: module clones with swapped globals.

``clone(module, **overrides)`` executes a reference module's source into a fresh module object
(registered under a private name), then replaces the named globals. Relative imports inside the
clone resolve to the real sibling modules, so only what is overridden differs. The reference
itself, used by the suite as the oracle in the same process, stays intact.
"""

from __future__ import annotations

import inspect
import itertools
import sys
import types

_counter = itertools.count()


def clone(module: types.ModuleType, __source: str | None = None, **overrides) -> types.ModuleType:
    """A fresh copy of ``module`` (its source, or ``__source`` in its place), ``overrides`` set."""
    name = f"{module.__name__}__mutant{next(_counter)}"
    copy = types.ModuleType(name, module.__doc__)
    copy.__dict__.update(__package__=module.__package__, __file__=module.__file__)
    sys.modules[name] = copy  # dataclasses look their module up while the class is built
    source = inspect.getsource(module) if __source is None else __source
    exec(compile(source, module.__file__, "exec"), copy.__dict__)
    copy.__dict__.update(overrides)
    return copy


def proxy(module: types.ModuleType, **overrides) -> types.SimpleNamespace:
    """A stand-in for ``module`` whose attributes are the module's, except ``overrides``."""
    attrs = {k: getattr(module, k) for k in dir(module) if not k.startswith("__")}
    attrs.update(overrides)
    return types.SimpleNamespace(**attrs)


def run_suite(impl_spec: str, select: str | None, workdir, timeout: float = 900.0) -> dict:
    """Run ``pytest --pyargs gefen_conformance --impl=SPEC [-k SELECT]`` in a subprocess (the whole suite
    when ``select`` is None); return its certificate. A selection runs under the hypothesis profile
    of :mod:`tests.proof_profile` (no shrinking: the same tests fail); the whole suite is a
    certification under the suite's own profile."""
    import json
    import os
    from pathlib import Path

    from . import proof_profile
    from .forked_pytest import FORKED

    root = Path(__file__).resolve().parents[1]
    cert = Path(workdir) / "certificate.json"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    )
    args = [
        "--pyargs",
        "gefen_conformance",
        f"--impl={impl_spec}",
        *(["-k", select, *proof_profile.ARGS] if select is not None else []),
        f"--certificate={cert}",
        "-p",
        "no:cacheprovider",
        "-q",
        "-p",
        "no:xdist",
    ]
    proc = FORKED.run(args, cwd=workdir, env=env, timeout=timeout)
    if not cert.exists():
        raise RuntimeError(
            "the suite wrote no certificate (exit "
            f"{proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    data = json.loads(cert.read_text())
    data["_exit_code"] = proc.returncode
    return data


def failures(certificate: dict) -> int:
    """Failed plus errored tests, from the certificate's summary counts (not its verdict string)."""
    summary = certificate["summary"]
    return int(summary.get("failed", 0)) + int(summary.get("error", 0))


def failed_tests(certificate: dict) -> list:
    return [t for t in certificate["tests"] if t["outcome"] in ("failed", "error")]


def failed_clauses(certificate: dict) -> set:
    return {c for t in certificate["tests"] if t["outcome"] in ("failed", "error") for c in t["clauses"]}


def caught_by(certificate: dict, clause: str) -> bool:
    """True when a failing test names ``clause`` or one of its sub-clauses."""
    return any(c == clause or c.startswith(clause + ".") for c in failed_clauses(certificate))
