"""Golden checkpoints: the committed set verifies, regenerates byte-identically, and the
manifest check catches tampering (SPEC 5.5)."""

from __future__ import annotations

import shutil

import pytest
import torch

from gefen_conformance import golden
from gefen_oracles import golden_manifest


def test_committed_goldens_verify():
    assert golden_manifest.check(golden.GOLDEN_DIR) == []


def test_committed_goldens_cover_the_catalogue():
    manifest = golden_manifest.read_manifest(golden.GOLDEN_DIR)
    assert set(manifest["cases"]) == set(golden.CASES)
    assert {c["world_size"] for c in manifest["cases"].values()} == {1, 2, 4}
    assert manifest["environment"]["byteorder"] in ("little", "big")


def test_regeneration_is_byte_identical(tmp_path):
    manifest = golden_manifest.read_manifest(golden.GOLDEN_DIR)
    if manifest["environment"]["torch"] != torch.__version__:
        pytest.skip(f"goldens were generated with torch {manifest['environment']['torch']}")
    fresh = golden.generate(tmp_path, "reference")
    for rel, info in manifest["files"].items():
        if rel.endswith(".distcp"):
            assert fresh["files"][rel]["md5"] == info["md5"], rel
    for name, info in manifest["cases"].items():
        assert fresh["cases"][name]["metadata_digest"] == info["metadata_digest"], name
        assert fresh["cases"][name]["content"] == info["content"], name


@pytest.mark.parametrize("tamper", ["flip", "remove", "extra"])
def test_check_catches_tampering(tmp_path, tamper):
    copy = tmp_path / "golden"
    shutil.copytree(golden.GOLDEN_DIR, copy)
    payload = sorted(copy.glob("w2_bf16/*.distcp"))[0]
    if tamper == "flip":
        data = bytearray(payload.read_bytes())
        data[len(data) // 2] ^= 0xFF
        payload.write_bytes(bytes(data))
    elif tamper == "remove":
        payload.unlink()
    else:
        (copy / "w1_fp32" / "stray.bin").write_bytes(b"x")
    problems = golden_manifest.check(copy)
    assert problems
    assert any(("w2_bf16" in p) or ("stray" in p) for p in problems)
