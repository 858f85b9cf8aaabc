"""Reproducer files beside a certificate (SPEC 4.5.6).

A failed suite test whose judge recorded a failing comparison carries its reproducer: the bytes
:meth:`gefen_conformance.judging.Judge.reproducer` made in the test process (a drawn case by value,
or the test's id to run again). The process that writes the certificate writes each, just before
the certificate and only then, to ``<certificate stem>.repro/<safe test id>.pt`` beside it (so a run whose
certificate goes to ``<stem>.partial.json`` writes ``<stem>.partial.repro/``), and records its
path relative to the certificate's directory as the test entry's ``repro``.

* A file already at that path is replaced only when it is a reproducer itself; any other file
  keeps its place, and the test's reproducer is not written (a note says so).
* Reproducers in that directory that the new certificate does not name (those of the
  certificate the new one replaces) are removed, only files that are reproducers; a directory
  left empty is removed.
* A reproducer that cannot be written leaves a note in the certificate; it never stops the
  certificate from being written.

:func:`load` reads one back for ``gefen-conformance repro`` (safely: ``weights_only``).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

SCHEMA = "gefen-conformance-repro/1"  # the same as gefen_conformance.judging.REPRO_SCHEMA
SUFFIX = ".pt"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class ReproError(ValueError):
    """A reproducer that cannot be read; the message is one line naming the file."""


def directory_for(certificate: os.PathLike) -> Path:
    """``<certificate stem>.repro`` beside the certificate."""
    path = Path(certificate)
    stem = path.name[: -len(".json")] if path.name.endswith(".json") else path.name
    return path.with_name(f"{stem}.repro")


def file_name(test_id: str) -> str:
    """A file name for ``test_id``: its characters outside ``[A-Za-z0-9._-]`` replaced, cut to
    100, and a hash of the whole id (distinct ids never share a file)."""
    readable = _UNSAFE.sub("_", test_id).strip("._")[:100]
    return f"{readable}-{hashlib.sha256(test_id.encode()).hexdigest()[:10]}{SUFFIX}"


def is_reproducer(path: os.PathLike) -> bool:
    """True when ``path`` is a readable reproducer file (schema :data:`SCHEMA`)."""
    try:
        return _read(Path(path)).get("schema") == SCHEMA
    except Exception:  # noqa: BLE001 - anything unreadable is not a reproducer
        return False


def _read(path: Path) -> dict:
    import torch

    data = torch.load(path, map_location="cpu", weights_only=True)
    return data if isinstance(data, dict) else {}


def write_beside(cert: dict, target: os.PathLike, blobs: dict) -> list:
    """Write each reproducer of ``blobs`` (``{test id: bytes}``) beside the certificate going to
    ``target`` and record it in ``cert``'s test entry (``repro``); notes in ``cert["notes"]`` say
    what could not be written. Returns the paths written."""
    target = Path(target)
    directory = directory_for(target)
    written, notes = [], []
    entries = {t["id"]: t for t in cert.get("tests", [])}
    for test_id, blob in sorted(blobs.items()):
        if test_id not in entries:
            continue
        path = directory / file_name(test_id)
        why = _write(path, blob)
        if why:
            notes.append(f"the reproducer of {test_id} was not written to {path}: {why}")
            continue
        written.append(path)
        entries[test_id]["repro"] = path.relative_to(target.parent).as_posix()
    _remove_stale(directory, set(written))
    known = cert.setdefault("notes", [])
    known += [n for n in notes if n not in known]
    return written


def _write(path: Path, blob: bytes):
    """None when written; else why not."""
    try:
        if path.parent.exists() and not path.parent.is_dir():
            return f"{path.parent} exists and is not a directory"
        if os.path.lexists(path) and not (path.is_file() and is_reproducer(path)):
            return "a file that is not a reproducer is there (left as it is)"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".writing-", suffix=SUFFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(blob)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None


def _remove_stale(directory: Path, keep: set) -> None:
    if not directory.is_dir():
        return
    for path in directory.glob(f"*{SUFFIX}"):
        if path not in keep and path.is_file() and not path.is_symlink() and is_reproducer(path):
            try:
                path.unlink()
            except OSError:
                pass
    try:
        directory.rmdir()  # only when empty
    except OSError:
        pass


def load(path: os.PathLike) -> dict:
    """The reproducer at ``path``; :class:`ReproError` naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise ReproError(f"{path}: no such file")
    try:
        data = _read(path)
    except Exception as error:  # noqa: BLE001 - any way torch.load fails
        raise ReproError(
            f"{path}: not a reproducer ({type(error).__name__}: {' '.join(str(error).split())[:200]})"
        ) from None
    if data.get("schema") != SCHEMA:
        raise ReproError(f"{path}: not a reproducer (schema {data.get('schema')!r}, expected {SCHEMA})")
    if not isinstance(data.get("cases"), list) or not data["cases"]:
        raise ReproError(f"{path}: holds no case")
    return data
