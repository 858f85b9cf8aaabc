"""Golden checkpoint manifests: what was generated, and a check that it is still there (SPEC 5.5).

A golden directory holds one sub-directory per case and ``MANIFEST.json``:

* ``files``: every file (relative path) with its size, md5 and sha256;
* ``cases``: per case, the canonical metadata digest and the content digest of every value;
* ``environment``: the torch and python versions and the byte order of the generating machine.

File md5s are only comparable under the same torch version (``torch.save`` framing changes);
content digests are comparable always.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import torch

from .digests import content_digests, file_md5, file_sha256, metadata_digest

MANIFEST = "MANIFEST.json"
SCHEMA = "gefen-golden-manifest/1"


def environment() -> dict:
    return {"torch": torch.__version__, "python": platform.python_version(), "byteorder": sys.byteorder}


def build_manifest(root: os.PathLike, cases: dict[str, dict]) -> dict:
    """Describe every file under ``root`` and every case directory named in ``cases``.

    ``cases`` maps a case directory name to its description (world size, what it covers).
    """
    root = Path(root)
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        rel = path.relative_to(root).as_posix()
        files[rel] = {"size": path.stat().st_size, "md5": file_md5(path), "sha256": file_sha256(path)}
    return {
        "schema": SCHEMA,
        "environment": environment(),
        "files": files,
        "cases": {
            name: dict(
                info, metadata_digest=metadata_digest(root / name), content=content_digests(root / name)
            )
            for name, info in sorted(cases.items())
        },
    }


def write_manifest(root: os.PathLike, manifest: dict) -> Path:
    path = Path(root) / MANIFEST
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return path


def read_manifest(root: os.PathLike) -> dict:
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{root}: no {MANIFEST}")
    manifest = json.loads(path.read_text())
    if manifest.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {manifest.get('schema')!r}, expected {SCHEMA}")
    return manifest


def check(root: os.PathLike) -> list[str]:
    """Problems with ``root`` against its manifest (empty when it verifies).

    Sizes and sha256 always; canonical digests always; extra or missing files are problems.
    """
    root = Path(root)
    manifest = read_manifest(root)
    problems = []
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST}
    for rel in sorted(set(manifest["files"]) - present):
        problems.append(f"{rel}: missing")
    for rel in sorted(present - set(manifest["files"])):
        problems.append(f"{rel}: not in the manifest")
    for rel, info in sorted(manifest["files"].items()):
        path = root / rel
        if not path.is_file():
            continue
        if path.stat().st_size != info["size"]:
            problems.append(f"{rel}: size {path.stat().st_size}, manifest says {info['size']}")
        elif file_sha256(path) != info["sha256"]:
            problems.append(f"{rel}: sha256 differs from the manifest")
    for name, info in sorted(manifest["cases"].items()):
        try:
            if metadata_digest(root / name) != info["metadata_digest"]:
                problems.append(f"{name}: metadata digest differs")
            content = content_digests(root / name)
        except (OSError, ValueError) as error:
            problems.append(f"{name}: unreadable ({error})")
            continue
        for key in sorted(set(info["content"]) | set(content)):
            if info["content"].get(key) != content.get(key):
                problems.append(f"{name}/{key}: content digest differs")
    return problems
