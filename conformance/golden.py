"""Golden checkpoints: a catalogue of small, deterministic DCP saves (SPEC 5.5).

Each case trains an implementation on sharded parameters at a given world size and saves it
through the implementation's DCP adapter. Generated from the reference, the cases are the
goldens committed under ``conformance/golden``; generated from another implementation, they
are compared with the goldens (file md5 under the same torch version, content digests always).
"""

from __future__ import annotations

import shutil
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from oracles import golden_manifest

from . import observations, registry
from .ranks import run_on_ranks
from .sharding import shard, sharded_parameter, world_mesh

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple
    group: int
    structured: bool = False  # per-column scales: the period search finds structure
    frozen: bool = False  # never gets a gradient: an uninitialized slot


@dataclass(frozen=True)
class Case:
    world_size: int
    dtype: torch.dtype
    params: tuple
    covers: str
    steps: int = 3
    tensor_lr: bool = False
    groups: tuple = field(default=({}, {"lr": 2e-3, "betas": (0.8, 0.99), "weight_decay": 0.01}))


CASES = {
    "w1_fp32": Case(
        1, torch.float32,
        (Param("enc.weight", (24, 16), 0, structured=True), Param("enc.bias", (16,), 0),
         Param("head.weight", (2053,), 1), Param("frozen.weight", (8, 4), 1, frozen=True)),
        covers="searched, fallback and period-1 blocks; an uninitialized slot; a tensor lr; two groups",
        tensor_lr=True,
    ),
    "w2_bf16": Case(
        2, torch.bfloat16,
        (Param("enc.weight", (5, 24), 0, structured=True), Param("dec.weight", (12, 8), 1)),
        covers="bf16 parameters; an uneven dim-0 split; two groups",
    ),
    "w4_fp32_empty_shard": Case(
        4, torch.float32,
        (Param("enc.weight", (16, 12), 0, structured=True), Param("tiny.weight", (2, 8), 1)),
        covers="world size 4; a parameter with empty shards on two ranks",
    ),
}


def _full(name: str, shape: tuple, salt: int, structured: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}:{salt}".encode()))
    x = torch.randn(shape, generator=g)
    if structured:
        x = x * (1.0 + torch.arange(shape[-1], dtype=torch.float32) % 4)
    return x


def train_case(impl, case: Case):
    """Build sharded params, the optimizer and train ``case.steps`` steps; return (params, optimizer)."""
    mesh = world_mesh()
    params = {p.name: sharded_parameter(_full(p.name, p.shape, 0, False).to(case.dtype), mesh) for p in case.params}
    groups = []
    for index, options in enumerate(case.groups):
        members = [(p.name, params[p.name]) for p in case.params if p.group == index]
        group = dict(options, params=members)
        if index == 0 and case.tensor_lr:
            group["lr"] = torch.tensor(1e-3)
        groups.append(group)
    optimizer = impl.make_optimizer(groups, factored_v_2d=False)
    for step in range(1, case.steps + 1):
        for p in case.params:
            params[p.name].grad = None if p.frozen else shard(_full(p.name, p.shape, step, p.structured).to(case.dtype), mesh)
        optimizer.step()
    return params, optimizer


def write_case(impl_spec: str, case_name: str, path: str) -> None:
    """Rank body: train one case with the implementation and save it with its DCP adapter."""
    import torch.distributed.checkpoint as dcp

    impl = registry.resolve(impl_spec)
    _, optimizer = train_case(impl, CASES[case_name])
    dcp.save({"optimizer": impl.dcp_state(optimizer)}, checkpoint_id=path)


def generate(root: Path, impl_spec: str = "reference", cases=None, timeout: float = 120.0) -> dict:
    """Write every case under ``root/<case>`` with ``impl_spec``; return the manifest (not written)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    chosen = {name: CASES[name] for name in (cases or CASES)}
    for name, case in chosen.items():
        target = root / name
        if target.exists():
            shutil.rmtree(target)
        run_on_ranks(write_case, case.world_size, args=(impl_spec, name, str(target)), timeout=timeout)
    descriptions = {n: {"world_size": c.world_size, "dtype": str(c.dtype), "covers": c.covers} for n, c in chosen.items()}
    return golden_manifest.build_manifest(root, descriptions)


def generate_into(root: Path, impl_spec: str = "reference") -> Path:
    """Generate every case and write the manifest next to them."""
    return golden_manifest.write_manifest(root, generate(root, impl_spec))


def compare_with_goldens(impl_spec: str, golden_root: Path = GOLDEN_DIR) -> list[str]:
    """Differences between ``impl_spec``'s saves and the goldens (empty when they agree).

    Content digests are always compared; file md5s and the canonical metadata digest (which
    holds byte offsets that torch's serializer decides) only when this torch version is the one
    that generated the goldens, and a note says so otherwise.
    """
    manifest = golden_manifest.read_manifest(golden_root)
    same_torch = manifest["environment"]["torch"] == torch.__version__
    with tempfile.TemporaryDirectory(prefix="gefen-golden-") as tmp:
        ours = generate(Path(tmp), impl_spec, cases=list(manifest["cases"]))
    problems = []
    for name, info in manifest["cases"].items():
        mine = ours["cases"][name]
        # the metadata records byte offsets into the .distcp files, which torch's serializer decides
        if same_torch and mine["metadata_digest"] != info["metadata_digest"]:
            problems.append(f"{name}: metadata digest differs from the golden")
        for key in sorted(set(info["content"]) | set(mine["content"])):
            if info["content"].get(key) != mine["content"].get(key):
                problems.append(f"{name}/{key}: content differs from the golden")
    if not same_torch:
        observations.note(f"golden md5s and metadata digests not compared: this torch {torch.__version__} is not "
                          f"the goldens' {manifest['environment']['torch']} (content digests were compared)")
    else:
        # .metadata carries a random save id and the path: it is covered by the metadata digest
        for rel, file_info in manifest["files"].items():
            if not rel.endswith(".distcp"):
                continue
            mine = ours["files"].get(rel)
            if mine is None:
                problems.append(f"{rel}: not written")
            elif mine["md5"] != file_info["md5"]:
                problems.append(f"{rel}: md5 differs from the golden")
    return problems
