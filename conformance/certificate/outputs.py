"""Where a command will write, checked before it runs (SPEC 4.4.10).

A certification that runs for minutes and then cannot write its certificate has wasted the
minutes and left nothing. So every command that writes (``certify``, ``pytest --impl``,
``report --out``, ``golden generate``) asks :func:`problem` first and refuses, in one line with
exit status 4, a path it could not write: a directory that is read-only (permissions or a
read-only file system), a parent that is a file, a target that is a directory. Nothing is written
by the check.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def _nearest_existing(path: Path) -> Path:
    for candidate in [path, *path.parents]:
        if os.path.lexists(candidate):
            return candidate
    return Path(path.anchor or ".")


def _unwritable(directory: Path) -> str | None:
    if not directory.is_dir():
        return f"{directory} is not a directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        try:
            read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        return (
            f"{directory} is {'on a read-only file system' if read_only else 'not writable'} "
            f"({errno.errorcode.get(errno.EROFS if read_only else errno.EACCES)})"
        )
    return None


def problem(path: os.PathLike, *, what: str = "file") -> str | None:
    """Why ``path`` (a file to create or replace, or with ``what="directory"`` a directory to
    create or fill) could not be written, or None. The directories that would be made are checked
    through their nearest existing ancestor."""
    path = Path(path).absolute()
    if what == "file":
        if path.is_dir():
            return "it is a directory"
        directory = path.parent
    else:
        if os.path.lexists(path) and not path.is_dir():
            return "it exists and is not a directory"
        directory = path
    why = _unwritable(_nearest_existing(directory))
    return None if why is None else f"cannot write there: {why}"
