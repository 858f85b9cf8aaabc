"""Where each failed rank was: a source location per rank, for the certificate's ``where`` (SPEC 4.4.8).

:func:`where` takes a test's exception and, when it is (or wraps) a ``RankFailure`` of the rank
harness, returns one line per rank that raised, died with a stack dump, or hung:
``"rank N: path:line in function"``. The location is the innermost frame of the code under test
or of the suite (the scenario, the implementation, the reference, the oracles): not the
standard library, torch and pytest's own packages, nor the harness that ran the rank. When the
innermost frame of all is elsewhere (a collective in torch, a lock in ``threading``) it follows
in parentheses, so a hung rank says both which line of the scenario waited and on what.

It reads the outcomes' traceback text, whichever process wrote it: a Python traceback (most recent
call last; the last one when exceptions were chained) or a ``faulthandler`` dump (most recent call
first; of its threads, the one with the most frames of such code, the thread running the scenario).
"""

from __future__ import annotations

import os
import re
import sysconfig
from pathlib import Path

#: top-level packages whose frames are never "where": the machinery around the code under test
LIBRARIES = frozenset(
    {
        "torch",
        "numpy",
        "_pytest",
        "pytest",
        "pluggy",
        "hypothesis",
        "xdist",
        "execnet",
        "typing_extensions",
        "multiprocessing",
        "concurrent",
        "threading",
    }
)
_PYTHON_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
_DUMP_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
_DUMP_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+")
_HARNESS = ("/gefen_conformance/harness/",)
_PACKAGE_ROOT = (
    Path(__file__).resolve().parents[2]
)  # the folder holding gefen_conformance: the checkout's or site-packages
# any Python's standard library, also one of another machine (a torchrun rank on another node)
_ANY_STDLIB = re.compile(r"^.*?/lib/python\d+(?:\.\d+)?/")


def _stdlib_dirs() -> tuple:
    paths = sysconfig.get_paths()
    return tuple(sorted({str(Path(paths[k])) + "/" for k in ("stdlib", "platstdlib") if paths.get(k)}))


_STDLIB = _stdlib_dirs()


def _after_site_packages(path: str) -> str | None:
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return None


def is_library(path: str) -> bool:
    """True for a frame of the machinery (see the module docstring), False for code under test."""
    path = path.replace("\\", "/")
    if path.startswith("<") or any(marker in path for marker in _HARNESS):
        return True
    inside = _after_site_packages(path)
    if inside is not None:
        return inside.split("/", 1)[0] in LIBRARIES
    return path.startswith(_STDLIB) or _ANY_STDLIB.match(path) is not None


def short_path(path: str) -> str:
    """``path`` without the prefix that only says where Python, the checkout or the current
    directory is."""
    path = path.replace("\\", "/")
    inside = _after_site_packages(path)
    if inside is not None:
        return inside
    for prefix in _STDLIB:
        if path.startswith(prefix):
            return path[len(prefix) :]
    stdlib = _ANY_STDLIB.match(path)
    if stdlib:
        return path[stdlib.end() :]
    for root in (str(_PACKAGE_ROOT), os.getcwd()):  # the checkout; the directory the run started in
        root = root.replace("\\", "/").rstrip("/") + "/"
        if path.startswith(root):
            return path[len(root) :]
    return path


def _frames(lines, pattern) -> list:
    return [(m["path"], int(m["line"]), m["func"]) for m in map(pattern.match, lines) if m]


def _python_frames(text: str) -> list:
    """The last traceback's frames in ``text``, innermost first."""
    blocks = text.split("Traceback (most recent call last):")
    for block in reversed(blocks[1:]):
        frames = _frames(block.splitlines(), _PYTHON_FRAME)
        if frames:
            return frames[::-1]
    return []


def _dump_frames(text: str) -> list:
    """The frames of the dumped thread with the most frames of code under test, innermost first."""
    threads, current = [], None
    for line in text.splitlines():
        if _DUMP_THREAD.match(line.strip()):
            current = []
            threads.append(current)
        elif current is not None:
            match = _DUMP_FRAME.match(line)
            if match:
                current.append((match["path"], int(match["line"]), match["func"]))
    threads = [t for t in threads if t]
    if not threads:
        return []
    return max(threads, key=lambda frames: sum(not is_library(f[0]) for f in frames))  # first of the best


def _described(frame) -> str:
    path, line, func = frame
    return f"{short_path(path)}:{line} in {func}"


def location(traceback_text: str) -> str | None:
    """``"path:line in function"`` for one rank's traceback text (see the module docstring)."""
    frames = _python_frames(traceback_text) or _dump_frames(traceback_text)
    if not frames:
        return None
    own = next((f for f in frames if not is_library(f[0])), None)
    if own is None:
        return _described(frames[0])
    text = _described(own)
    return text if own is frames[0] else f"{text} (innermost: {_described(frames[0])})"


def rank_failure(error: BaseException) -> BaseException | None:
    """The ``RankFailure`` that ``error`` is or wraps: in an exception group, as its cause or
    context, or as its ``rank_failure`` attribute (an error that repeats a failure's text without
    chaining it, as the suite's checkpoint cache does for every test that uses a failed save)."""
    seen = set()
    pending = [error]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if type(current).__name__ == "RankFailure" and isinstance(getattr(current, "outcomes", None), list):
            return current
        pending += list(getattr(current, "exceptions", None) or ())
        pending += [getattr(current, "rank_failure", None), current.__cause__, current.__context__]
    return None


def where(error: BaseException | None) -> list[str]:
    """``["rank N: path:line in function", ...]`` for every failed rank of the ``RankFailure`` that
    ``error`` is or wraps, in rank order; empty otherwise, and for a rank without a stack."""
    failure = rank_failure(error) if error is not None else None
    if failure is None:
        return []
    lines = []
    for outcome in failure.outcomes:
        if getattr(outcome, "status", "ok") == "ok":
            continue
        found = location(str(getattr(outcome, "traceback", "") or ""))
        if found:
            lines.append(f"rank {outcome.rank}: {found}")
    return lines
