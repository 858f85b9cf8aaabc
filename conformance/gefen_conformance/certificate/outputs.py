"""Where a command will write, tried before it runs (SPEC 4.4.10).

A certification that runs for minutes and then cannot write its certificate has wasted the
minutes and left nothing. So every command that writes (``certify``, ``pytest --impl``,
``report --out``, ``golden generate``, ``vectors export``, ``merge``, ``expectations``) asks
:func:`problem` first and refuses, in one line with exit status 4, a path it could not write. The
check is a real write, not a permission guess (root passes every permission check, yet cannot
create a file in ``/proc``): the missing parent directories are created, a probe file is created,
written, flushed and removed in the directory that will hold the output, and any error on the way
(a parent that is a regular file, a read-only mount, a pseudo file system, permissions) is the
answer. A target that is a directory is refused before that.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def _probe(directory: Path) -> str | None:
    """Create ``directory`` (and its parents) if missing, then create, write and remove a probe
    file in it; why that failed, or None."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"cannot create {directory}: {error.strerror or error}"
    if not directory.is_dir():
        return f"{directory} is not a directory"
    probe = directory / f".gefen-write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        return f"cannot create a file in {directory}: {error.strerror or error}"
    try:
        os.write(fd, b"probe")
        os.fsync(fd)
    except OSError as error:
        return f"cannot write a file in {directory}: {error.strerror or error}"
    finally:
        os.close(fd)
        try:
            os.unlink(probe)
        except OSError:
            pass
    return None


def problem(path: os.PathLike, *, what: str = "file") -> str | None:
    """Why ``path`` (a file to create or replace, or with ``what="directory"`` a directory to
    create or fill) could not be written, or None; the directories it needs are created."""
    path = Path(path).absolute()
    if what == "file":
        if path.is_dir():
            return "it is a directory"
        if os.path.lexists(path) and not os.access(path, os.W_OK):
            return f"cannot write there: {path} is not writable"
        directory = path.parent
    else:
        if os.path.lexists(path) and not path.is_dir():
            return "it exists and is not a directory"
        directory = path
    for ancestor in [directory, *directory.parents]:
        if os.path.lexists(ancestor):
            if not ancestor.is_dir():
                return f"cannot write there: {ancestor} is not a directory"
            break
    why = _probe(directory)
    return None if why is None else f"cannot write there: {why}"


def write_text(path: os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file beside it, then renamed
    over it (the missing parent directories are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
