"""Replay one failed comparison from its reproducer (SPEC 4.5.6): ``gefen-conformance repro CERT
TEST_ID`` (:mod:`gefen_conformance.cli.repro`).

Every suite test that failed a comparison left a reproducer beside its certificate
(:mod:`gefen_conformance.certificate.repro_files`), named by the test entry's ``repro``.
:func:`replay_test` loads it, resolves the implementation the certificate names (its spec, through
the registry, as the plugin does; ``impl`` replays against another), and runs the comparison
again, never the rest of the suite:

* a drawn case (an input-space case, a staging example: the kinds of
  :mod:`gefen_conformance.suite.replayable`) is rebuilt from its inputs and judged in this one
  process, the implementation's side on the saved inputs against the reference's side and the
  oracles recomputed from the same inputs;
* any other test is deterministic, so its reproducer names it and it runs again, by its id, in a
  new pytest process (``pytest --impl=SPEC ID``, with the rank processes a scenario needs); the
  comparisons it failed are read from the reproducer that run leaves.

It prints the input in words, then for every comparison that fails its margin (``error``,
``bound``, ``used``; or ``differing`` of ``total``) beside the certificate's, the problems the
suite printed, and its worst elements (index, expected, observed, allowed), then one verdict
line: reproduced bit for bit (every margin and problem equal to the certificate's), failing
differently, or passing now.

A replay that cannot start raises :class:`Unreadable` (the certificate or the reproducer cannot be
read) or :class:`Refused` (a test the certificate or the suite does not hold, a test without a
reproducer, a test the implementation skips, an implementation or device that cannot be loaded).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class ReproError(Exception):
    """A replay that cannot start; the message says why, in one line."""


class Unreadable(ReproError):
    """The certificate or the reproducer cannot be read."""


class Refused(ReproError):
    """The test, the implementation or the device asked for cannot be replayed."""


def _find_test(cert: dict, test_id: str) -> dict:
    tests = cert.get("tests") or []
    for test in tests:
        if test["id"] == test_id:
            return test
    for test in tests:  # a path or pytest node id ending in the suite's id
        if test_id.endswith("/" + test["id"]) or test_id.endswith("." + test["id"]):
            return test
    with_repro = [t["id"] for t in tests if t.get("repro")]
    listed = ("; tests with a reproducer: " + ", ".join(with_repro[:10])) if with_repro else ""
    raise Refused(f"the certificate holds no test {test_id!r}{listed}")


def replay_test(
    certificate: Path, test_id: str, *, impl: str | None = None, device: str | None = None, top: int = 10
) -> bool:
    """Replay the failed comparison of ``test_id`` from the reproducer beside ``certificate``, against
    the implementation ``impl`` (default: the certificate's) on ``device`` (default: the failing
    run's), listing up to ``top`` worst elements per comparison; whether a comparison still fails.
    Raises :class:`Unreadable` or :class:`Refused` when the replay cannot start."""
    from gefen_conformance.certificate import read, repro_files

    started = time.monotonic()
    try:
        cert = read.load(certificate)
    except read.CertificateError as error:
        raise Unreadable(str(error)) from None
    test = _find_test(cert, test_id)
    if not test.get("repro"):
        why = (
            f"it {test['outcome']}"
            if test["outcome"] != "failed"
            else "it failed outside a comparison (an exception or an exact rule of its own)"
        )
        raise Refused(f"{test['id']} has no reproducer in {certificate} ({why})")
    path = Path(certificate).parent / test["repro"]
    try:
        payload = repro_files.load(path)
    except repro_files.ReproError as error:
        raise Unreadable(str(error)) from None
    implementation, spec = _implementation(impl, cert, payload)
    chosen = _device(device, payload)

    from gefen_conformance.certificate import numeric_profile

    print(
        f"reproducer {path} of {test['id']} (SPEC "
        f"{', '.join(payload.get('clauses') or test.get('clauses') or [])})"
    )
    print(
        f"implementation {implementation.name} {implementation.version} ({spec}) on {chosen}; written "
        f"under torch {payload.get('torch')}, replayed under torch {_torch_version()}"
    )
    certified = {m.get("what"): m for m in test.get("margins") or []}
    failing, same = 0, True
    count = len(payload["cases"])
    for k, entry in enumerate(payload["cases"], 1):
        if "rerun" in entry:
            words = entry.get("input") or test.get("input") or "the inputs of the test as the suite runs it"
            print(f"case {k} of {count}: {words}")
            began = time.monotonic()
            comparisons, profile = _rerun(str(entry["rerun"]), spec, chosen)
            elapsed = time.monotonic() - began
            print(f"replayed in {elapsed:.2f} s (the test run again by its id; profile {profile})")
        else:
            from gefen_conformance.suite import replayable, space_checks, staging  # noqa: F401 - the kinds

            try:
                case = replayable.from_payload(entry["case"])
            except (KeyError, TypeError, ValueError) as error:
                raise Unreadable(f"{path}: case {k}: {error}") from None
            bitwise = (
                entry["bitwise"]
                if impl is None and device is None
                else numeric_profile.bitwise(implementation, chosen)
            )
            print(f"case {k} of {count}: {case.describe()}; profile {_profile(bitwise)}")
            began = time.monotonic()
            comparisons = case.comparisons(implementation, bitwise=bitwise)
            print(f"replayed in {time.monotonic() - began:.2f} s")
        failing += _print_comparisons(comparisons, certified, max(top, 0))
        same &= _same_as_recorded(comparisons, certified, entry)
    elapsed = time.monotonic() - started
    if failing == 0:
        print(f"verdict: passes now: no comparison of {test['id']} fails ({elapsed:.2f} s)")
        return False
    if same:
        print(
            f"verdict: reproduced bit for bit: {failing} failing comparison{'s' if failing != 1 else ''} of "
            f"{test['id']}, every margin and problem equal to the certificate's ({elapsed:.2f} s)"
        )
    else:
        print(
            f"verdict: fails differently from the certificate: {failing} failing comparison"
            f"{'s' if failing != 1 else ''} of {test['id']} ({elapsed:.2f} s)"
        )
    return True


def _profile(bitwise: bool) -> str:
    return "torch-exact (bitwise)" if bitwise else "tolerance"


def _rerun(test_id: str, spec: str, device) -> tuple:
    """Run the suite test ``test_id`` again, alone, in a new pytest process in a scratch directory
    (the current directory first on its path, where the run resolved ``spec``): ``(comparisons,
    profile)``, the comparisons it failed as its reproducer records them (none when it passes)."""
    from gefen_conformance.certificate import read, repro_files
    from gefen_conformance.plugin.selection import CENSUS_ENV

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    env[CENSUS_ENV] = "1"  # one test's run: no census of the whole suite (SPEC 4.4.2) to wait for
    with tempfile.TemporaryDirectory(prefix="gefen-repro-") as scratch:
        target = Path(scratch) / "rerun.json"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--impl={spec}"]
        command += [f"--gefen-device={device}", f"--certificate={target}", test_id]
        ran = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True)
        written = sorted(Path(scratch).glob("rerun*.json"))
        if not written:
            tail = "\n".join((ran.stdout + ran.stderr).strip().splitlines()[-20:])
            print(tail, file=sys.stderr)
            why = f"the rerun of {test_id} wrote no certificate (pytest exit {ran.returncode})"
            if ran.returncode == 4:  # pytest's usage error: no such test, an option refused
                raise Refused(why)
            return _comparisons([], [why]), "unknown"
        cert = read.load(written[0])
        test = next((t for t in cert.get("tests") or [] if t["id"] == test_id), None)
        if test is None or test["outcome"] == "skipped":
            why = f"it was skipped: {test.get('reason')}" if test else "no such test in the suite"
            raise Refused(f"the rerun did not run {test_id} ({why})")
        profile = _profile((cert.get("profile") or {}).get("name") == "torch-exact")
        if test["outcome"] in ("passed", "xpassed"):
            return _comparisons([], []), profile
        if not test.get("repro"):
            return _comparisons([], [f"the rerun failed outside a comparison: {test.get('reason')}"]), profile
        (entry,) = repro_files.load(written[0].parent / test["repro"])["cases"]
        return _comparisons(entry["failing"], entry["problems"]), profile


def _comparisons(failing: list, problems: list):
    """The comparisons a reproducer recorded as failing (with their worst elements) and its problems."""
    from gefen_oracles.numeric import Comparison, Comparisons, Offender

    out = Comparisons()
    for f in failing:
        worst = [
            Offender(w["label"], tuple(w["index"]), w["expected"], w["observed"], w["allowed"])
            for w in f["worst"]
        ]
        fields = {k: f[k] for k in ("what", "kind", "error", "bound", "differing", "total")}
        out.add(Comparison(**fields, problems=list(f["problems"]), offenders=worst))
    out.problems = list(problems)
    return out


def _implementation(impl: str | None, cert: dict, payload: dict):
    from gefen_conformance.implementations import registry

    spec = (
        impl
        or (payload.get("implementation") or {}).get("spec")
        or cert["implementation"].get("spec")
        or cert["implementation"]["name"]
    )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as under `python -m pytest`, where the run resolved it
    try:
        return registry.resolve(spec), spec
    except registry.ImplementationError as error:
        raise Refused(f"--impl={spec}: {error}" if impl else str(error)) from None


def _device(device: str | None, payload: dict):
    from gefen_conformance.harness import devices

    name = device or payload.get("device") or "cpu"
    try:
        chosen = devices.parse(name)
        devices.select(chosen)
    except devices.DeviceUnavailable as error:
        raise Refused(f"device {error}") from None
    return chosen


def _torch_version() -> str:
    import torch

    return torch.__version__


def _margin_text(c) -> str:
    if c.kind == "bitwise":
        return f"{c.differing} of {c.total} elements differ"
    used = _used(c.error, c.bound)
    return f"error {c.error!r}, bound {c.bound!r}, used {'inf' if math.isinf(used) else f'{used:.6g}'}"


def _certified_text(c, certified: dict) -> str:
    m = certified.get(c.what)
    if m is None:
        return "the certificate recorded no such comparison"
    if _same_margin(c, m):
        return "the same in the certificate"
    if m.get("kind") == "bitwise":
        return f"the certificate: {m.get('differing')} of {m.get('total')} differ"
    return f"the certificate: error {m.get('error')!r}, bound {m.get('bound')!r}"


def _used(error: float, bound: float) -> float:
    if error == 0.0:
        return 0.0
    return math.inf if bound <= 0.0 or not math.isfinite(error) else error / bound


def _same_float(a, b) -> bool:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return False
    return (math.isnan(a) and math.isnan(b)) or a == b


def _same_margin(c, m: dict) -> bool:
    if m.get("kind") != c.kind:
        return False
    if c.kind == "bitwise":
        return m.get("differing") == c.differing and m.get("total") == c.total
    return _same_float(m.get("error"), c.error) and _same_float(m.get("bound"), c.bound)


def _same_as_recorded(comparisons, certified: dict, entry: dict) -> bool:
    """Every failing comparison's margin equal to the one the reproducer recorded for this case (the
    certificate's margin of a test that judged many examples is the worst over all of them), and
    the problems equal to those the run recorded."""
    recorded = {f.get("what"): f for f in entry.get("failing") or []}
    failing = [c for c in comparisons if c.problems]
    return all(c.what in recorded and _same_margin(c, recorded[c.what]) for c in failing) and list(
        comparisons.problems
    ) == list(entry.get("problems") or [])


def _print_comparisons(comparisons, certified: dict, top: int) -> int:
    """Print every failing comparison with its worst elements; returns how many failed."""
    failing = 0
    named = set()
    for c in comparisons:
        if c.ok:
            continue
        failing += 1
        named.update(c.problems)
        print(f"\nFAILED {c.what}: {_margin_text(c)} ({_certified_text(c, certified)})")
        for problem in c.problems:
            print(f"  {problem}")
        if c.offenders and top:
            _print_offenders(c.offenders[:top], bitwise=c.kind == "bitwise")
    rules = [p for p in comparisons.problems if p not in named]
    if rules:
        failing += 1
        print("\nFAILED exact rules (no numeric margin):")
        for problem in rules:
            print(f"  {problem}")
    return failing


def _print_offenders(offenders, *, bitwise: bool) -> None:
    head = (
        "worst elements (bit patterns must be equal)"
        if bitwise
        else "worst elements (|observed - expected| / allowed, worst first)"
    )
    print(f"  {head}:")
    rows = [("tensor", "index", "expected", "observed", "allowed", "share")]
    for o in offenders:
        share = "inf" if math.isinf(o.share) else f"{o.share:.4g}"
        rows.append(
            (
                o.label,
                str(list(o.index)),
                repr(o.expected),
                repr(o.observed),
                "0 (bitwise)" if bitwise else f"{o.allowed:.6g}",
                "differs" if bitwise else share,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("    " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
