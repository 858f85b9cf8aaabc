"""Checking a certificate someone else wrote, and merging partial ones (SPEC 4.4.15, 4.4.16).

:func:`verify` first validates a certificate against the certificate's JSON Schema
(``certificate.schema.json`` beside this module, draft 2020-12, with the ``jsonschema`` library):
one that does not validate is refused, each violation named by its JSON path and the schema rule it
breaks (:func:`schema_problems`). Then it re-derives the verdict, summary, rules section, per-clause
table and capability skips from the per-test records with the code that built them, checks every
record against its own margins (a passed test cannot hold a comparison outside its bound),
recomputes the integrity digest, and compares the suite hash with the installed suite's. It returns
the problems found (an empty list: it verifies) and the facts a reader needs: the implementation's
provenance (a dirty checkout named), the world sizes, launchers and devices run, the expectations
used. :func:`load` reads a certificate for it, leaving its structure to the schema.

:func:`merge` makes one certificate of several (shards, reruns): all of one suite hash, one
implementation and its provenance, one numeric and hypothesis profile, one expectations file; a
test in two of them with different outcomes is a conflict, and a conflict is refused. The merge is
``conformant`` only if its tests cover the whole suite (every certificate records the suite's test
ids, ``run.suite_tests``); otherwise it is ``partial``, naming what is missing.
"""

from __future__ import annotations

import functools
import json
import os
import reprlib
from collections import Counter
from importlib import resources
from pathlib import Path

import jsonschema

from gefen_conformance.certificate import build, rules
from gefen_conformance.certificate.outcomes import Outcome
from gefen_conformance.certificate.read import CertificateError

__all__ = ["MergeConflict", "load", "merge", "records", "rederive", "schema", "schema_problems", "verify"]

#: The certificate's JSON Schema, shipped beside this module.
SCHEMA_FILE = "certificate.schema.json"
#: The parts of a certificate :func:`verify` re-derives from its test records and run facts.
DERIVED = ("summary", "verdict", "rules", "clauses", "capability_skips")
#: How much of a value a schema violation shows.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxdict, _SHOWN.maxlist, _SHOWN.maxstring, _SHOWN.maxother = 1, 3, 3, 40, 40


class MergeConflict(ValueError):
    """Certificates that cannot be merged; the message names what differs."""


@functools.cache
def schema() -> dict:
    """The certificate's JSON Schema (draft 2020-12)."""
    return json.loads(resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


@functools.cache
def _locations() -> dict:
    """``{id(object): its JSON pointer}`` of every object in the schema, to name where a rule stands."""
    out: dict = {}

    def walk(node, pointer: str) -> None:
        if isinstance(node, dict):
            out[id(node)] = pointer
            for key, value in node.items():
                walk(value, f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{pointer}/{i}")

    walk(schema(), "#")
    return out


def schema_problems(cert) -> list[str]:
    """Every way ``cert`` breaks the certificate's JSON Schema, one line each, by JSON path: the
    JSON path, what is wrong there (a large value shown in brief), and the rule broken: the schema
    keyword and its place in the schema."""
    errors = sorted(jsonschema.Draft202012Validator(schema()).iter_errors(cert), key=_position)
    # a document of another schema (or none) is judged by its schema id alone
    errors = [e for e in errors if list(e.absolute_path) == ["schema"]] or errors
    out = []
    for error in errors:
        message = error.message.replace(repr(error.instance), _SHOWN.repr(error.instance))
        where = _locations().get(id(error.schema))
        if where is None:  # not found by identity: the path the validation took to it instead
            where = "#/" + "/".join(map(str, list(error.absolute_schema_path)[:-1]))
        rule = f"{error.validator!r} at {where}/{error.validator}"
        out.append(f"{error.json_path}: {message} (schema rule {rule})")
    return out


def _position(error) -> list:
    """A violation's JSON path as a sort key: array indices in numeric order, before object keys."""
    return [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in error.absolute_path]


def load(path: os.PathLike) -> dict:
    """The JSON at ``path``, for :func:`verify` to judge; CertificateError naming the file when it
    cannot be read or is not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise CertificateError(f"{path}: cannot read: {error}") from None
    except json.JSONDecodeError as error:
        raise CertificateError(f"{path}: not JSON ({error})") from None


def records(cert: dict) -> list:
    """The certificate's tests as the :class:`~gefen_conformance.certificate.build.TestRecord` s
    it was built from."""
    out = []
    for t in cert.get("tests") or []:
        out.append(
            build.TestRecord(
                t["id"],
                list(t.get("clauses") or []),
                Outcome(t["outcome"]),
                float(t.get("duration_s") or 0.0),
                t.get("reason") or "",
                list(t.get("margins") or []),
                list(t.get("notes") or []),
                list(t.get("missing_capabilities") or []),
                not_run=any(e.get("id") == t["id"] for e in (cert.get("run") or {}).get("not_run") or []),
                where=list(t.get("where") or []),
                input=t.get("input"),
            )
        )
    return out


def _facts(cert: dict, executed: int, narrowed_by=None, not_run=None) -> build.RunFacts:
    run = cert.get("run") or {}
    return build.RunFacts(
        started=run.get("started", ""),
        finished=run.get("finished", ""),
        interrupted="a signal" if run.get("interrupted") else None,
        narrowed_by=list(run.get("narrowed_by") or []) if narrowed_by is None else narrowed_by,
        expected_tests=run.get("expected_tests"),
        executed_tests=executed,
        hypothesis=run.get("hypothesis"),
        exit_status=int(run.get("exit_status") or 0),
        not_run=list(run.get("not_run") or []) if not_run is None else not_run,
    )


def _run_record(cert: dict, recs: list) -> build.RunRecord:
    record = build.RunRecord(implementation=dict(cert.get("implementation") or {}))
    record.stale_expected_failures = list(cert.get("stale_expected_failures") or [])
    record.expectations = cert.get("expectations")
    record.notes = []
    for r in recs:
        record.records[r.nodeid] = r
    return record


def rederive(cert: dict) -> dict:
    """The certificate rebuilt from its records and run facts (the parts a verdict depends on)."""
    recs = records(cert)
    rebuilt = build.build(
        _run_record(cert, recs),
        _facts(cert, len(recs)),
        profile=cert.get("profile") or {},
        suite=cert.get("suite") or {},
        platform_=cert.get("platform") or {},
        execution=cert.get("execution") or {},
    )
    return {k: rebuilt[k] for k in DERIVED}


def _contradictions(test: dict) -> list[str]:
    """A record whose outcome its own margins contradict: a passed test holding a comparison outside
    its bound, or elements that differ bitwise."""
    if test.get("outcome") != "passed":
        return []
    out = []
    for m in test.get("margins") or []:
        if m.get("kind") == "tolerance" and (m.get("used") is None or m["used"] > 1.0):
            out.append(f"{test['id']} passed, yet its comparison {m.get('what')!r} is outside its bound")
        elif m.get("kind") == "bitwise" and m.get("differing"):
            out.append(f"{test['id']} passed, yet {m['differing']} elements of {m.get('what')!r} differ")
    return out


def _difference(stored, derived, shown: int = 3) -> str:
    """The stored and derived values in brief: for mappings only the keys that differ."""
    if not (isinstance(stored, dict) and isinstance(derived, dict)):
        return f"stored {stored!r}, derived {derived!r}"
    keys = sorted(k for k in set(stored) | set(derived) if stored.get(k) != derived.get(k))
    parts = [f"{k}: stored {stored.get(k)!r}, derived {derived.get(k)!r}" for k in keys[:shown]]
    if len(keys) > shown:
        parts.append(f"and {len(keys) - shown} more keys")
    return "; ".join(parts)


def _rules_in_brief(section) -> dict:
    """A ``rules`` section flattened to one short value per key, so a mismatch names what differs
    (``ids.unchecked``, ``counts.failed``) without printing hundreds of ids."""
    if not isinstance(section, dict):
        return {"rules": section}
    out = {k: section.get(k) for k in ("total", "summary")}
    for status, n in (section.get("counts") or {}).items():
        out[f"counts.{status}"] = n
    for status, ids in (section.get("ids") or {}).items():
        out[f"ids.{status}"] = build.cut(rules.compact(ids), 120)
    for reason, ids in (section.get("not_certified_reasons") or {}).items():
        out[f"not_certified_reasons.{reason}"] = build.cut(rules.compact(ids), 120)
    return out


def verify(cert: dict, installed_suite_sha256: str | None) -> tuple[list[str], list[str]]:
    """``(problems, facts)`` of a certificate: problems empty when it verifies. A certificate that
    breaks the schema is refused with its violations alone (no facts: nothing of it is trusted)."""
    problems = schema_problems(cert)
    if problems:
        return problems, []
    stored = (cert.get("integrity") or {}).get("sha256")
    if stored is None:
        problems.append("it carries no integrity digest (written by an older suite, or edited)")
    elif stored != build.integrity(cert):
        problems.append("its integrity digest does not match its content: it was edited after it was written")
    again = rederive(cert)
    for key in DERIVED:
        if again[key] != cert.get(key):
            stored, derived = cert.get(key), again[key]
            if key == "rules":
                stored, derived = _rules_in_brief(stored), _rules_in_brief(derived)
            problems.append(f"its {key} is not what its test records give: {_difference(stored, derived)}")
    for test in cert.get("tests") or []:
        problems += _contradictions(test)
    suite = cert.get("suite") or {}
    if installed_suite_sha256 is not None and suite.get("content_sha256") != installed_suite_sha256:
        problems.append(
            f"its suite (content sha256 {suite.get('content_sha256')}) is not the installed one "
            f"({installed_suite_sha256}): verify it with the suite that wrote it"
        )
    return problems, facts(cert)


def facts(cert: dict) -> list[str]:
    """What a reader of a certificate needs besides its verdict, one line each."""
    impl = cert.get("implementation") or {}
    prov = impl.get("provenance") or {}
    lines = [f"implementation {impl.get('name')} {impl.get('version')} (spec {impl.get('spec')})"]
    dist = prov.get("distribution") or {}
    if prov.get("module"):
        where = f" in {dist.get('name')} {dist.get('version')}" if dist else ""
        lines.append(f"  from {prov['module']} ({prov.get('file')}){where}")
    git = prov.get("git")
    if git:
        state = "DIRTY: uncommitted changes" if git.get("dirty") else "clean"
        lines.append(f"  checkout {git.get('root')} at {git.get('commit')} ({state} in {git.get('package')})")
    elif prov:
        lines.append("  not from a git checkout")
    suite = cert.get("suite") or {}
    sgit = suite.get("git") or {}
    lines.append(
        f"suite {suite.get('name')} {suite.get('version')} sha256 {suite.get('content_sha256')}"
        + (f" at {sgit.get('commit')}{' (dirty)' if sgit.get('dirty') else ''}" if sgit else "")
    )
    ex = cert.get("execution") or {}
    lines.append(
        f"execution: launcher {ex.get('launcher')}, world sizes {ex.get('world_sizes')}, "
        f"device {ex.get('device_type')} {ex.get('device_names')}, backend {ex.get('backend')}"
    )
    merged = (cert.get("run") or {}).get("merged_from")
    if merged:
        lines.append(f"merged from {len(merged)} certificates")
    exp = cert.get("expectations")
    if exp:
        lines.append(
            f"expectations {exp.get('file')} sha256 {exp.get('sha256')}: {len(exp.get('entries') or [])} "
            f"entries, {len(exp.get('stale') or [])} stale"
        )
    else:
        lines.append("expectations: none")
    return lines


# ------------------------------------------------------------------------------------ merge


def _same(certs: list, what: str, get) -> None:
    values = [get(c) for c in certs]
    if any(v != values[0] for v in values[1:]):
        shown = "; ".join(f"{name}: {v!r}" for name, v in zip([c.get("_source", "?") for c in certs], values))
        raise MergeConflict(f"the certificates differ in {what}: {shown}")


def _provenance(cert: dict) -> dict:
    impl = dict(cert.get("implementation") or {})
    prov = dict(impl.get("provenance") or {})
    git = prov.get("git") or {}
    return {
        "name": impl.get("name"),
        "version": impl.get("version"),
        "spec": impl.get("spec"),
        "capabilities": impl.get("capabilities"),
        "distribution": prov.get("distribution"),
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
    }


def merge(certs: list, sources: list) -> dict:
    """One certificate of ``certs`` (read from ``sources``); :class:`MergeConflict` when they cannot
    be merged."""
    if not certs:
        raise MergeConflict("nothing to merge")
    for cert, source in zip(certs, sources):
        cert["_source"] = str(source)
    try:
        _same(certs, "schema", lambda c: c.get("schema"))
        _same(certs, "suite (content sha256)", lambda c: (c.get("suite") or {}).get("content_sha256"))
        _same(certs, "implementation and its provenance", _provenance)
        _same(certs, "numeric profile", lambda c: (c.get("profile") or {}).get("name"))
        _same(certs, "tier", lambda c: (c.get("execution") or {}).get("tier") or "default")
        _same(
            certs,
            "hypothesis profile",
            lambda c: ((c.get("run") or {}).get("hypothesis") or {}).get("profile"),
        )
        _same(certs, "expectations file", lambda c: (c.get("expectations") or {}).get("sha256"))
        _same(certs, "suite's test ids", lambda c: (c.get("run") or {}).get("suite_tests"))
        by_id: dict = {}
        for cert, source in zip(certs, sources):
            for t in cert.get("tests") or []:
                old = by_id.get(t["id"])
                if old is not None and old[0]["outcome"] != t["outcome"]:
                    raise MergeConflict(
                        f"{t['id']} is {old[0]['outcome']} in {old[1]} and {t['outcome']} in {source}"
                    )
                if old is None:
                    by_id[t["id"]] = (t, source, cert)
    finally:
        for cert in certs:
            cert.pop("_source", None)
    first = certs[0]
    suite_tests = (first.get("run") or {}).get("suite_tests")
    recs = []
    for _, (t, _, cert) in sorted(by_id.items()):
        recs += [r for r in records({**cert, "tests": [t]})]
    not_run = [e for c in certs for e in (c.get("run") or {}).get("not_run") or [] if e.get("id") in by_id]
    if suite_tests is None:
        narrowed = ["the suite's test ids are unknown (a certificate without run.suite_tests)"]
    else:
        missing = sorted(set(suite_tests) - set(by_id))
        narrowed = (
            [f"{len(missing)} suite tests in no merged certificate (e.g. {missing[0]})"] if missing else []
        )
    runs = [c.get("run") or {} for c in certs]
    facts_ = _facts(first, len(recs), narrowed_by=narrowed, not_run=not_run)
    facts_.started = min(r.get("started", "") for r in runs)
    facts_.finished = max(r.get("finished", "") for r in runs)
    facts_.interrupted = "a signal" if any(r.get("interrupted") for r in runs) else None
    facts_.expected_tests = len(suite_tests) if suite_tests is not None else None
    record = _run_record(first, recs)
    record.stale_expected_failures = sorted(
        set.intersection(*(set(c.get("stale_expected_failures") or []) for c in certs))
    )
    record.notes = []
    for c in certs:
        record.notes += [n for n in c.get("notes") or [] if n not in record.notes]
    execution = dict(first.get("execution") or {})
    execution["world_sizes"] = sorted(
        {w for c in certs for w in (c.get("execution") or {}).get("world_sizes") or []}
    )
    out = build.build(
        record,
        facts_,
        profile=first.get("profile") or {},
        suite=first.get("suite") or {},
        platform_=first.get("platform") or {},
        execution=execution,
    )
    out["run"]["exit_status"] = int(build.EXIT_STATUS[build.Verdict(out["verdict"])])
    out["run"]["merged_from"] = [str(s) for s in sources]
    if suite_tests is not None:
        out["run"]["suite_tests"] = list(suite_tests)
    if first.get("expectations") is not None:
        exp = dict(first["expectations"])
        stale = [
            e
            for e in exp.get("stale") or []
            if all(e in ((c.get("expectations") or {}).get("stale") or []) for c in certs)
        ]
        exp["stale"] = stale
        out["expectations"] = exp
    for t in out["tests"]:
        test, source, _ = by_id[t["id"]]
        if test.get("repro"):  # where it lies: write_merged makes it relative to the merged certificate
            t["repro"] = str((Path(source).parent / test["repro"]).absolute())
    return out


def write_merged(merged: dict, path: Path) -> Path:
    """Write what :func:`merge` returned to ``path``, every reproducer named relative to it."""
    directory = Path(path).absolute().parent
    for t in merged["tests"]:
        if t.get("repro"):
            t["repro"] = Path(os.path.relpath(t["repro"], directory)).as_posix()
    return build.write(merged, path)


def outcome_counts(cert: dict) -> Counter:
    return Counter(t["outcome"] for t in cert.get("tests") or [])
