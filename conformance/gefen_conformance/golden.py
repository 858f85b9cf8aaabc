"""Golden checkpoints: a catalogue of small, deterministic DCP saves (SPEC 5.5).

Each case trains an implementation on sharded parameters at a given world size and saves it
through the implementation's DCP adapter. Generated from the reference, the cases are the
goldens committed under ``conformance/gefen_conformance/golden``; generated from another implementation, they
are compared with the goldens: bitwise (file md5 under the same torch version, content digests)
for an implementation that claims the torch-exact profile, by the rules of SPEC 5.6.11 otherwise.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gefen_conformance.harness import launch
from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations import registry
from gefen_conformance.workload import models, saving
from gefen_oracles import golden_manifest
from gefen_oracles.numeric import Comparison, Comparisons

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

    def model(self) -> models.Model:
        """The case as a :class:`gefen_conformance.workload.models.Model`: per-parameter seeds
        ``name:0`` for the start and ``name:step`` for gradients, per-column scales ``1 + column % 4``
        where ``structured``; a tensor lr (new for every call) in group 0 when ``tensor_lr``."""
        hypers = [dict(options) for options in self.groups]
        if self.tensor_lr:
            hypers[0]["lr"] = torch.tensor(1e-3)
        return models.Model(
            shapes={p.name: p.shape for p in self.params},
            groups=tuple(tuple(p.name for p in self.params if p.group == g) for g in range(len(self.groups))),
            init=models.per_name,
            salt=0,
            seed=models.crc32_seed("{name}:{step}"),
            hypers=tuple(hypers),
            structured=frozenset(p.name for p in self.params if p.structured),
            column_period=4,
            frozen=frozenset(p.name for p in self.params if p.frozen),
        )


CASES = {
    "w1_fp32": Case(
        1,
        torch.float32,
        (
            Param("enc.weight", (24, 16), 0, structured=True),
            Param("enc.bias", (16,), 0),
            Param("head.weight", (2053,), 1),
            Param("frozen.weight", (8, 4), 1, frozen=True),
        ),
        covers="searched, fallback and period-1 blocks; an uninitialized slot; a tensor lr; two groups",
        tensor_lr=True,
    ),
    "w2_bf16": Case(
        2,
        torch.bfloat16,
        (Param("enc.weight", (5, 24), 0, structured=True), Param("dec.weight", (12, 8), 1)),
        covers="bf16 parameters; an uneven dim-0 split; two groups",
    ),
    "w4_fp32_empty_shard": Case(
        4,
        torch.float32,
        (Param("enc.weight", (16, 12), 0, structured=True), Param("tiny.weight", (2, 8), 1)),
        covers="world size 4; a parameter with empty shards on two ranks",
    ),
}


def train_case(impl, case: Case):
    """Rank body helper: the case's sharded parameters on this rank's mesh and the implementation's
    optimizer over them, trained ``case.steps`` steps; returns ``(params, optimizer)``."""
    model = case.model()
    params = models.parameters(model, dtype=case.dtype, mesh=world_mesh())
    optimizer = impl.make_optimizer(models.param_groups(model, params), factored_v_2d=False)
    models.train(model, optimizer, params, range(1, case.steps + 1))
    return params, optimizer


def _implementation(impl):
    """``impl`` itself, or the implementation its ``--impl`` spec names."""
    return registry.resolve(impl) if isinstance(impl, str) else impl


def write_case(impl, case_name: str, path: str) -> None:
    """Rank body: train one case with the implementation ``impl`` and save it with its DCP adapter."""
    _, optimizer = train_case(impl, CASES[case_name])
    saving.save(impl, optimizer, path, planner=False)


def reference_codebook_gap(case_name: str) -> float:
    """Rank body: the largest gap between adjacent codewords of the codebook the reference learns
    on this rank for ``case_name`` (a checkpoint carries no codebook; SPEC 5.6.11 needs it)."""
    from gefen_oracles import codebook_quality

    _, optimizer = train_case(registry.resolve("reference"), CASES[case_name])
    return codebook_quality.largest_gap(optimizer.codebook)


def generate(root: Path, impl="reference", cases=None, timeout: float = 120.0, run=None) -> dict:
    """Write every case under ``root/<case>`` with ``impl`` (an implementation or its spec) on the
    active launcher, through ``run`` (``gefen_conformance.harness.launch.run`` unless given); return
    the manifest (not written)."""
    impl, run = _implementation(impl), run or launch.run
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    chosen = {name: CASES[name] for name in (cases or CASES)}
    for name, case in chosen.items():
        target = root / name
        if target.exists():
            shutil.rmtree(target)
        run(write_case, case.world_size, (impl, name, str(target)), timeout=timeout)
    descriptions = {
        n: {"world_size": c.world_size, "dtype": str(c.dtype), "covers": c.covers} for n, c in chosen.items()
    }
    return golden_manifest.build_manifest(root, descriptions)


def generate_into(root: Path, impl="reference") -> Path:
    """Generate every case and write the manifest next to them."""
    return golden_manifest.write_manifest(root, generate(root, impl))


def compare_goldens(
    impl, golden_root: Path = GOLDEN_DIR, bitwise: bool | None = None, run=None
) -> Comparisons:
    """The saves of the catalogue by ``impl`` (an implementation or its spec; through ``run``, as
    :func:`generate`) against the goldens, by the rules of its profile.

    Both profiles: every non-float value exactly (SPEC 5.6.11), and every case's canonical
    metadata digest (structure: keys, dtypes, shapes, chunks, storage layout, and byte offsets
    that torch's serializer decides) when this torch version generated the goldens. Bitwise
    profile (``bitwise``, by default whether the implementation declares ``cpu-bit-exact`` and the
    run's device is the CPU, SPEC 4.6.4):
    content digests and every element's bits, and file md5s under the goldens' torch. Tolerance
    profile: float state by :func:`gefen_oracles.checkpoint_compare.compare`, never by digest: a kernel
    that rounds differently writes other bytes for a correct state. What was not compared for
    want of the goldens' torch is noted (SPEC 4.4.8).
    """
    from gefen_conformance.certificate import numeric_profile
    from gefen_oracles import checkpoint_compare
    from gefen_oracles.checkpoint_reader import read_nested

    impl = _implementation(impl)
    if bitwise is None:
        bitwise = numeric_profile.bitwise(impl)
    goldens = golden_manifest.read_manifest(golden_root)  # the reference's saves
    same_torch = goldens["environment"]["torch"] == torch.__version__
    out = Comparisons()
    with tempfile.TemporaryDirectory(prefix="gefen-golden-") as tmp:
        saves = generate(Path(tmp), impl, cases=list(goldens["cases"]), run=run)  # the implementation's
        for name, reference in goldens["cases"].items():
            impl_case = saves["cases"][name]
            if same_torch:
                differs = impl_case["metadata_digest"] != reference["metadata_digest"]
                problems = [f"{name}: metadata digest differs from the golden"] if differs else []
                out.add(_differing("golden metadata digest", 1, problems))
            reference_state = read_nested(Path(golden_root) / name).get("optimizer", {})
            impl_state = read_nested(Path(tmp) / name).get("optimizer", {})
            gap = (
                2.0
                if bitwise
                else max(
                    launch.run(reference_codebook_gap, CASES[name].world_size, args=(name,), timeout=120.0)
                )
            )
            out.merge(
                checkpoint_compare.compare(
                    reference_state,
                    impl_state,
                    bitwise=bitwise,
                    param_dtype=CASES[name].dtype,
                    where=name,
                    largest_gap=gap,
                )
            )
            if bitwise:
                keys = sorted(set(reference["content"]) | set(impl_case["content"]))
                changed = [k for k in keys if reference["content"].get(k) != impl_case["content"].get(k)]
                problems = [f"{name}/{k}: content differs from the golden" for k in changed]
                out.add(_differing("golden content digests", len(keys), problems))
    if not same_torch:
        skipped = "md5s and metadata digests" if bitwise else "metadata digests"
        out.note(
            f"golden {skipped} not compared: this torch {torch.__version__} is not "
            f"the goldens' {goldens['environment']['torch']}"
        )
    if bitwise and same_torch:
        # .metadata carries a random save id and the path: it is covered by the metadata digest
        payloads = {rel: info for rel, info in goldens["files"].items() if rel.endswith(".distcp")}
        changed = []
        for rel, reference in payloads.items():
            impl_file = saves["files"].get(rel)
            if impl_file is None:
                changed.append(f"{rel}: not written")
            elif impl_file["md5"] != reference["md5"]:
                changed.append(f"{rel}: md5 differs from the golden")
        out.add(_differing("golden payload files (md5)", len(payloads), changed))
    return out


def _differing(what: str, total: int, problems: list[str]) -> Comparison:
    """A bitwise comparison of ``total`` items, one problem for each that differs."""
    return Comparison(what, "bitwise", differing=len(problems), total=total, problems=problems)
