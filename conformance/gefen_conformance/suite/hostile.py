"""The catalogue of hostile checkpoints (SPEC 3.10): one valid reference checkpoint written at world
size 1, and variants derived from it at the byte level (files removed, truncated, bytes flipped) or
by re-saving its decoded content with one entry changed. Variants load at any world size, so the
same directory serves the one-process and the multi-rank checks.

:func:`load_attempt` tries one variant on a live optimizer of an implementation, and
:func:`refusal_problems` says what is wrong with its outcome: the suite's tests
(``test_hostile_checkpoints``) and the project's rule mutants use both.

"Nothing changed" compares one implementation's live state with itself, bit for bit (tensor
values, identities and versions), in both numeric profiles (SPEC 5.6.11)."""

from __future__ import annotations

import copy
import os
import shutil

import torch
import torch.distributed.checkpoint as dcp

from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations import registry
from gefen_conformance.implementations.contract import Implementation
from gefen_conformance.workload import models, saving
from gefen_oracles.checkpoint_reader import read_nested


def _gradient_seed(name: str, index: int, step: int) -> int:
    return 100 * step + index


#: ``c.scale``: a period-1 slot.
MODEL = models.Model(
    shapes={"a.weight": (8, 8), "b.weight": (4, 3), "c.scale": (1,)},
    groups=(("a.weight",), ("b.weight", "c.scale")),
    hypers=({}, {"lr": 2e-3}),
    init=models.linspace(-1, 1),
    seed=_gradient_seed,
)
STEPS = 2
LIVE_FIRST_STEP = 50  # the live optimizer a variant is loaded into trains on other gradients


# ------------------------------------------------------------------------------ the catalogue


def _payload(path):
    (name,) = [f for f in os.listdir(path) if f.endswith(".distcp")]
    return os.path.join(path, name)


def _flip_sign_in_second_moment(nested):
    target = nested["slot_00000000.second_moment"].numpy().tobytes()

    def damage(path):
        f = _payload(path)
        data = bytearray(open(f, "rb").read())
        at = bytes(data).find(target)
        if at < 0:
            raise RuntimeError("second moment bytes not found in the payload")
        data[at + 3] ^= 0x80  # the sign bit of the first little-endian float32
        open(f, "wb").write(bytes(data))

    return damage


def _set(key, make):
    def change(d):
        d[key] = make(d)

    return change


def _poke(key, index, value):
    def change(d):
        d[key] = d[key].clone()
        d[key][index] = value

    return change


BYTE_LEVEL = {
    "aborted-save-no-metadata": lambda nested: lambda p: os.remove(os.path.join(p, ".metadata")),
    "truncated-payload": lambda nested: lambda p: open(_payload(p), "r+b").truncate(1000),
    "missing-payload": lambda nested: lambda p: os.remove(_payload(p)),
    "flipped-archive-header": lambda nested: lambda p: open(_payload(p), "r+b").write(b"XX"),
    "flipped-sign-bit-in-second-moment": _flip_sign_in_second_moment,
}

CONTENT_LEVEL = {
    "missing-key": lambda d: d.pop("slot_00000000.momentum"),
    "wrong-format-version": _set("format_version", lambda d: torch.tensor(3)),
    "wrong-dense-shape": _set("slot_00000000.momentum", lambda d: torch.zeros(4, 8)),
    "extra-slot": _set("slot_count", lambda d: torch.tensor(int(d["slot_count"]) + 1)),
    "renamed-parameter": lambda d: d["param_identities"][0].__setitem__("name", "z.weight"),
    "nan-momentum": _poke("slot_00000000.momentum", (0, 0), float("nan")),
    "inf-second-moment": _poke("slot_00000001.second_moment", (1, 1), float("inf")),
    "negative-second-moment": _poke("slot_00000000.second_moment", (0, 0), -1.0),
    "initialized-with-zero-step": _set("slot_00000000.step", lambda d: torch.tensor(0)),
    "fresh-with-counters": _set("slot_00000001.initialized", lambda d: torch.tensor(0, dtype=torch.uint8)),
    "initialized-flag-two": _set("slot_00000001.initialized", lambda d: torch.tensor(2, dtype=torch.uint8)),
    "deterministic-flag-set": _set("deterministic", lambda d: torch.tensor(1, dtype=torch.uint8)),
    "negative-lr": lambda d: d["param_group_hypers"][1].__setitem__("lr", -1.0),
    "beta-of-one": lambda d: d["param_group_hypers"][0].__setitem__("beta2", 1.0),
}

CASES = sorted(BYTE_LEVEL) + sorted(CONTENT_LEVEL)
#: The rule a content-level case breaks alone, and the words its ValueError names (SPEC 3.3-3.5);
#: the other cases are refused by DCP or by the rules of §3.10.1 with no words of their own.
RULES = {
    "wrong-format-version": ("3.3.2", "format version"),
    "extra-slot": ("3.3.3", "parameter count differs"),
    "renamed-parameter": ("3.3.5", "parameter identities"),
    "deterministic-flag-set": ("3.3.7", "deterministic"),
    "initialized-flag-two": ("3.4.2", None),
    "nan-momentum": ("3.4.3", "non-finite"),
    "inf-second-moment": ("3.4.3", "non-finite"),
    "negative-second-moment": ("3.4.3", "nonnegative"),
    "initialized-with-zero-step": ("3.4.4", "initialized but carries step"),
    "fresh-with-counters": ("3.4.4", "uninitialized but carries nonzero counters"),
    "negative-lr": ("3.5.1", "invalid lr"),
    "beta-of-one": ("3.5.1", "invalid beta2"),
}


def craft_all(root: str) -> dict:
    """Write the valid checkpoint and every variant under ``root``; return ``{case: path}``."""
    reference = registry.resolve("reference")
    _, opt = saving.trained(reference, MODEL, world_mesh(), steps=range(STEPS))
    base = os.path.join(root, "valid")
    saving.save(reference, opt, base, planner=False)
    nested = read_nested(base)["optimizer"]
    paths = {"valid": base}
    for name, make in BYTE_LEVEL.items():
        path = os.path.join(root, name)
        shutil.copytree(base, path)
        make(nested)(path)
        paths[name] = path
    for name, change in CONTENT_LEVEL.items():
        content = copy.deepcopy(nested)
        change(content)
        path = os.path.join(root, name)
        dcp.save({"optimizer": content}, checkpoint_id=path, process_group=saving.group())
        paths[name] = path
    return paths


# ------------------------------------------------------------------------------ load attempts


def snapshot(params, opt) -> list:
    """Everything a load could change, with tensor identities and versions."""
    out = []
    for name, p in params.items():
        out.append(("param", name, p.to_local().clone()))
    for entry in opt.state.values():
        for key, value in sorted(entry.items()):
            if torch.is_tensor(value):
                out.append(("state", key, value.clone(), id(value), value._version))
            else:
                out.append(("state", key, value))
    for group in opt.param_groups:
        out.append(
            (
                "group",
                sorted(
                    (k, v if not torch.is_tensor(v) else ("t", v.item(), id(v)))
                    for k, v in group.items()
                    if k != "params"
                ),
            )
        )
    return out


def same(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if len(x) != len(y):
            return False
        for u, v in zip(x, y):
            if torch.is_tensor(u):
                if not (torch.is_tensor(v) and u.dtype == v.dtype and torch.equal(u, v)):
                    return False
            elif u != v:
                return False
    return True


def load_attempt(impl, path: str) -> dict:
    """Train a live optimizer, try to load ``path`` into it; report the error and whether anything changed."""
    steps = range(LIVE_FIRST_STEP, LIVE_FIRST_STEP + STEPS)
    params, opt = saving.trained(impl, MODEL, world_mesh(), steps=steps)
    before = snapshot(params, opt)
    error, value_error = None, False
    try:
        saving.load(impl, opt, path)
    except BaseException as exc:  # DCP's CheckpointException derives from BaseException
        error, value_error = f"{type(exc).__name__}: {exc}", isinstance(exc, ValueError)
    return {"error": error, "value_error": value_error, "unchanged": same(before, snapshot(params, opt))}


def load_attempt_on_rank(impl: Implementation, path: str) -> dict:
    """Rank body: the same attempt at the launched world size."""
    return load_attempt(impl, path)


def refusal_problems(case: str, outcome: dict) -> list:
    """What is wrong with ``outcome``, the :func:`load_attempt` of ``case``: accepted, refused with an
    error other than the ValueError naming the words of the rule ``case`` breaks (:data:`RULES`,
    the message starting ``SPEC <rule> (<case>)``), or live state changed."""
    if outcome["error"] is None:
        return [f"{case}: the load was accepted"]
    problems = []
    rule, words = RULES.get(case, (None, None))
    if rule is not None and not (outcome["value_error"] and (words or "") in outcome["error"]):
        named = f"ValueError naming {words!r}" if words else "ValueError"
        problems.append(f"SPEC {rule} ({case}): raised {outcome['error']}; expected {named}")
    if not outcome["unchanged"]:
        problems.append(f"{case}: refused, but live state changed ({outcome['error']})")
    return problems
