"""Expectations files: which suite tests an implementation is expected to fail or skip, and where
(SPEC 4.4.14).

A kernel team keeps one TOML file per backend, as array-api-tests keeps an xfails file and the
WebGPU CTS its expectations::

    [[expectation]]
    test = "test_dcp_payload.py::test_payload_md5s_match_the_reference[w4-*]"   # a glob over suite ids
    kind = "xfail"                  # strict: the test must fail; or "skip": not run at all
    reason = "torn slot scalars on empty shards"
    link = "https://example.org/issues/12"                                     # optional
    when = { device = "cuda", torch = ">=2.7,<2.12", launcher = "torchrun", world_size = 4 }

Every condition of ``when`` is optional and all must hold: ``device`` is the run's device type
(``cpu``, ``cuda``, ...), ``torch`` a version specifier over torch's release (``2.13.0+cpu`` is
``2.13.0``), ``launcher`` ``pool`` or ``torchrun``, ``world_size`` the torchrun job's size (the pool
has none). :func:`load` reads and checks a file (one :class:`ExpectationsError` naming the entry
and the problem); :meth:`Expectations.for_test` gives the entry that applies to a test here. An
entry whose conditions hold but that matches no selected test is *stale*; one whose conditions do
not hold here is *inactive*; both are reported in the certificate, which also records the file's
path, sha256 and entries. :func:`from_certificate` writes a starting file from a certificate's
failures (``gefen-conformance expectations CERT``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Environment", "Expectation", "Expectations", "ExpectationsError", "from_certificate", "load"]

KINDS = ("xfail", "skip")
CONDITIONS = ("device", "torch", "launcher", "world_size")
KEYS = ("test", "kind", "reason", "link", "when")


class ExpectationsError(ValueError):
    """An expectations file that cannot be used; the message names the file, the entry and why."""


@dataclass(frozen=True)
class Environment:
    """What the conditions of an entry are matched against."""

    device: str
    torch: str
    launcher: str
    world_size: int | None


@dataclass(frozen=True)
class Expectation:
    test: str
    kind: str
    reason: str
    link: str | None = None
    when: dict = field(default_factory=dict)
    index: int = 0  # its position in the file, for messages

    def holds(self, env: Environment) -> bool:
        """Whether every condition of ``when`` holds in ``env``."""
        when = self.when
        if "device" in when and when["device"] != env.device:
            return False
        if "launcher" in when and when["launcher"] != env.launcher:
            return False
        if "world_size" in when and when["world_size"] != env.world_size:
            return False
        if "torch" in when:
            from packaging.specifiers import SpecifierSet
            from packaging.version import Version

            release = Version(env.torch.split("+", 1)[0])
            if release not in SpecifierSet(when["torch"]):
                return False
        return True

    def matches(self, test_id: str) -> bool:
        return fnmatch.fnmatchcase(test_id, self.test)

    def as_dict(self) -> dict:
        out = {"test": self.test, "kind": self.kind, "reason": self.reason}
        if self.link:
            out["link"] = self.link
        if self.when:
            out["when"] = dict(self.when)
        return out

    def describe(self) -> str:
        link = f" ({self.link})" if self.link else ""
        return f"{self.reason}{link} [expectations entry {self.index + 1}]"


@dataclass
class Expectations:
    path: Path
    sha256: str
    entries: list
    used: set = field(default_factory=set)  # indices of the entries that applied to a selected test

    def for_test(self, test_id: str, env: Environment) -> Expectation | None:
        """The first entry that matches ``test_id`` and holds in ``env`` (recorded as used)."""
        for entry in self.entries:
            if entry.matches(test_id) and entry.holds(env):
                self.used.add(entry.index)
                return entry
        return None

    def report(self, env: Environment) -> dict:
        """The certificate's ``expectations``: the file, its sha256, its entries, and which entries
        were stale (they hold here and matched no selected test) or inactive (they do not hold here)."""
        return {
            "file": str(self.path),
            "sha256": self.sha256,
            "entries": [e.as_dict() for e in self.entries],
            "stale": [e.as_dict() for e in self.entries if e.holds(env) and e.index not in self.used],
            "inactive": [e.as_dict() for e in self.entries if not e.holds(env)],
        }


def _check_entry(path: Path, index: int, raw) -> Expectation:
    where = f"{path}: expectation {index + 1}"
    if not isinstance(raw, dict):
        raise ExpectationsError(f"{where}: a table of {', '.join(KEYS)}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ExpectationsError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    for key in ("test", "kind", "reason"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ExpectationsError(f"{where}: {key} must be a non-empty string")
    if raw["kind"] not in KINDS:
        raise ExpectationsError(f"{where}: kind {raw['kind']!r} (known: {', '.join(KINDS)})")
    if "link" in raw and not isinstance(raw["link"], str):
        raise ExpectationsError(f"{where}: link must be a string")
    when = raw.get("when", {})
    if not isinstance(when, dict):
        raise ExpectationsError(f"{where}: when must be a table of {', '.join(CONDITIONS)}")
    unknown = sorted(set(when) - set(CONDITIONS))
    if unknown:
        raise ExpectationsError(
            f"{where}: unknown condition(s) {', '.join(unknown)} (known: {', '.join(CONDITIONS)})"
        )
    for key in ("device", "launcher", "torch"):
        if key in when and not isinstance(when[key], str):
            raise ExpectationsError(f"{where}: when.{key} must be a string")
    if "launcher" in when and when["launcher"] not in ("pool", "torchrun"):
        raise ExpectationsError(f"{where}: when.launcher {when['launcher']!r} (known: pool, torchrun)")
    if "world_size" in when and (type(when["world_size"]) is not int or when["world_size"] < 1):
        raise ExpectationsError(f"{where}: when.world_size must be a positive integer")
    if "torch" in when:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(when["torch"])
        except InvalidSpecifier:
            raise ExpectationsError(
                f"{where}: when.torch {when['torch']!r} is not a version specifier"
            ) from None
    return Expectation(raw["test"], raw["kind"], raw["reason"], raw.get("link"), dict(when), index)


def load(path) -> Expectations:
    """The expectations of the TOML file ``path``; :class:`ExpectationsError` for a file that cannot
    be read or holds anything but ``[[expectation]]`` tables of the documented keys."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ExpectationsError(f"{path}: {error.strerror or error}") from None
    try:
        parsed = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ExpectationsError(f"{path}: not TOML: {error}") from None
    unknown = sorted(set(parsed) - {"expectation"})
    if unknown:
        raise ExpectationsError(
            f"{path}: unknown top-level key(s) {', '.join(unknown)} (only [[expectation]] tables)"
        )
    raw = parsed.get("expectation", [])
    if not isinstance(raw, list):
        raise ExpectationsError(f"{path}: expectation must be an array of tables ([[expectation]])")
    entries = [_check_entry(path, i, r) for i, r in enumerate(raw)]
    return Expectations(path.absolute(), hashlib.sha256(data).hexdigest(), entries)


def _toml_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def from_certificate(cert: dict) -> str:
    """A starting expectations file (TOML text) from a certificate: an ``xfail`` entry for every
    test that failed or errored, with its reason, conditioned on the certificate's device type,
    torch release, launcher and world size."""
    execution, platform = cert.get("execution") or {}, cert.get("platform") or {}
    when = {"device": execution.get("device_type") or "cpu"}
    if platform.get("torch"):
        when["torch"] = "==" + str(platform["torch"]).split("+", 1)[0]
    if execution.get("launcher"):
        when["launcher"] = execution["launcher"]
    if execution.get("world_size"):
        when["world_size"] = int(execution["world_size"])
    implementation = cert.get("implementation") or {}
    lines = [
        f"# Expectations of {implementation.get('name', '?')} {implementation.get('version', '?')}, "
        "from its certificate's failures.",
        "# Each entry: test (a glob over suite ids), kind (xfail: must fail; skip: not run), reason,",
        "# an optional link, and conditions under when (device, torch, launcher, world_size).",
        "",
    ]
    conditions = ", ".join(f"{k} = {_toml_string(v) if isinstance(v, str) else v}" for k, v in when.items())
    for test in cert.get("tests") or []:
        if test.get("outcome") not in ("failed", "error"):
            continue
        reason = (test.get("reason") or test["outcome"]).split(" | ")[0][:300]
        lines += [
            "[[expectation]]",
            f"test = {_toml_string(test['id'])}",
            'kind = "xfail"',
            f"reason = {_toml_string(reason)}",
            f"when = {{ {conditions} }}",
            "",
        ]
    return "\n".join(lines)
