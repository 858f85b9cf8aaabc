"""The pinned steps as test vectors (SPEC 4.5.8): what ``gefen-conformance vectors export DIR`` writes.

:func:`export` writes every pinned step the certify profile runs (``test_optimizer.py``'s
:data:`~gefen_conformance.suite.pinned_steps.PINNED_STEPS`, the same cases, through the same
:class:`~gefen_conformance.suite.optimizer_cases.PinnedCase`) as test vectors a kernel's own unit
test can read without this suite: one safetensors file per step (written by
:mod:`gefen_oracles.safetensors_io`) with the step's inputs, the state before it, the reference's
state and parameters after it, and the per-element bounds of the tolerance profile from
:func:`gefen_oracles.pinned_step.element_bounds` (the oracle's own float64 arithmetic and the
bounds of :mod:`gefen_oracles.kernel_bounds`), and a JSON manifest naming the suite, every
file and tensor, the hyperparameters and counters, what each bound means and its SPEC clause;
:func:`refusal` says why a directory cannot take them.

``vectors check DIR RESULTS`` judges a kernel's results against them
(:mod:`gefen_oracles.vector_check`): numpy, safetensors and ml_dtypes only, neither torch (whose
import loads ``torch.distributed``) nor pytest. Both commands are :mod:`gefen_conformance.cli.vectors`'s.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: What the tensors of a vector file hold (``NAME``: a parameter's name).
TENSORS = {
    "codebook": "F32 [256]: the frozen codebook the step uses (SPEC 1.6)",
    "NAME.param": "the parameter before the step, in its dtype",
    "NAME.grad": "the gradient of the step, in its dtype",
    "NAME.lr, .beta1, .beta2, .eps, .weight_decay": "F64 []: the group's hyperparameters (an lr tensor "
    "as its fp32 value)",
    "NAME.bc1, NAME.bc2": "F64 []: the step's bias corrections 1 - beta1^step and 1 - beta2^count "
    "(SPEC 1.8.5), from the counters after the step",
    "NAME.before.KEY": "the native state entry before the step (m_codebook, m_magnitude, vmean or "
    "v_row/v_col; absent for a fresh state)",
    "NAME.reference.KEY": "the reference's state entry after the step (m_codebook, m_magnitude, the "
    "second moment) and its parameter after it (NAME.reference.param)",
    "NAME.expected.Q, NAME.allowed.Q": "F64: the exact value of Q and the largest |observed - expected| "
    "a correct kernel may show per element; Q is a second moment, m_magnitude, codeword or param",
    "NAME.update.rate, .decayed, .rounding, .rtol": "F64: the pieces of the parameter's bound, "
    "rate = lr * stepsize and decayed = p0 (1 - lr wd) exact per element, rtol the update's relative "
    "bound, rounding the parameter's rounding allowance per element",
}
#: What each bound means, with its clause.
BOUNDS = {
    "vmean, v_row, v_col": "the second moment after the step against its exact value: relative bound "
    "of SPEC 5.6.2-5.6.3 times |exact|",
    "m_magnitude": "the block's largest |momentum| against its exact value: the block's worst "
    "pre-quantization error plus the magnitude's rounding (SPEC 5.6.4)",
    "codeword": "codebook[m_codebook] against the exact normalized momentum: the nearest codeword's "
    "distance plus twice the normalization's bound (SPEC 5.6.6); inf where the magnitude's bound "
    "leaves it open",
    "param": "the parameter after the step against decayed - rate * codeword * magnitude with the "
    "kernel's own codewords and magnitudes (SPEC 5.6.8): rtol * |rate * codeword * magnitude| + "
    "rounding, rounding taken at the largest |p1| a step within the magnitude's bound reaches; "
    "expected.param/allowed.param are that target for the reference's codewords and magnitudes",
    "exact": "dtypes, shapes (the period is the index's row length) and counters exactly (SPEC 5.6)",
    "not here": "the update bias (SPEC 5.6.9) is a statistic over a whole step: the suite judges it",
}
#: The clauses a vector's checks apply, besides its test's own.
CLAUSES = {
    "4.5.8": "the vectors, their files and their check",
    "5.6.1": "the pinned step and the rule every bound follows",
    "5.6.2": "the mean of squares",
    "5.6.3": "the second moment",
    "5.6.4": "the momentum and its block magnitude",
    "5.6.5": "the stepsize",
    "5.6.6": "the codeword choice",
    "5.6.8": "the parameter update",
}
RESULTS = (
    "one safetensors file per vector, named as the vector's file, holding for each parameter NAME of "
    "the vector the kernel's NAME.param, NAME.m_codebook (U8), NAME.m_magnitude (F32) and second "
    "moment (F32 NAME.vmean, or NAME.v_row and NAME.v_col), of the dtypes and shapes the vector's "
    "`results` names; optionally NAME.step and NAME.vmean_step or NAME.factored_step (integers, "
    "checked exactly)"
)


def refusal(directory: Path) -> str | None:
    """Why ``vectors export`` cannot write ``directory``, or None (its missing parents are created)."""
    from gefen_conformance.certificate import outputs
    from gefen_oracles import vector_check

    if directory.is_dir() and any(directory.iterdir()):
        try:
            vector_check.load_manifest(directory)
        except vector_check.VectorError:
            return f"{directory} holds files and is not a vectors directory ({vector_check.MANIFEST})"
    return outputs.problem(directory, what="directory")


def file_name(test_id: str) -> str:
    """A vector's file name from its test's id: ``pinned_block_step.plain-float32-pinned-codebook``."""
    module, _, rest = test_id.partition("::")
    name, _, params = rest.partition("[")
    stem = name.removeprefix("test_") + ("." + params.rstrip("]") if params else "")
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in stem.replace("torch.", ""))
    return f"{safe}.safetensors"


def export(directory: Path) -> dict:
    """Write every pinned step of the certify profile to ``directory`` (created if missing): the
    vectors' files and :data:`~gefen_oracles.vector_check.MANIFEST`. Returns the manifest."""
    import json

    from gefen_conformance.certificate.build import suite_facts
    from gefen_conformance.suite import pinned_steps
    from gefen_oracles import numeric, vector_check

    directory.mkdir(parents=True, exist_ok=True)
    _remove_previous(directory)
    vectors = []
    for step in pinned_steps.PINNED_STEPS:
        vectors.append(_write_vector(directory, step, list(pinned_steps.CLAUSES[step.test])))
    manifest = {
        "schema": {"name": vector_check.SCHEMA, "version": vector_check.SCHEMA_VERSION},
        "generated_by": "gefen-conformance vectors export",
        "suite": suite_facts(git=False),
        "profile": str(numeric.Profile.TOLERANCE),
        "clauses": CLAUSES,
        "tensors": TENSORS,
        "bounds": BOUNDS,
        "results": RESULTS,
        "vectors": vectors,
    }
    path = directory / vector_check.MANIFEST
    path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def _remove_previous(directory: Path) -> None:
    """The files an earlier export's manifest names (nothing else is touched)."""
    from gefen_oracles import vector_check

    try:
        previous = vector_check.load_manifest(directory)
    except vector_check.VectorError:
        return
    for entry in previous["vectors"]:
        name = entry.get("file") if isinstance(entry, dict) else None
        if isinstance(name, str) and name == Path(name).name and name.endswith(".safetensors"):
            try:
                os.unlink(directory / name)
            except FileNotFoundError:
                pass


def _write_vector(directory: Path, step, clauses: list) -> dict:
    import torch

    from gefen_conformance.workload import models, runs
    from gefen_oracles import pinned_step, safetensors_io

    case = step.case()
    reference = case.run(models.REFERENCE)
    codebook = case.state_dict["gefen_codebook"].detach().to(torch.float32)
    tensors = {"codebook": _array(codebook)}
    parameters = []
    stepped = runs.param_steps(case.state_dict, reference, factored=case.factored)
    for s in stepped:
        bounds = pinned_step.element_bounds(s, codebook)
        parameters.append(_parameter(tensors, s, bounds, codebook))
    name = file_name(step.test_id)
    safetensors_io.write(
        directory / name,
        tensors,
        metadata={"schema": "gefen-test-vectors/1", "vector": step.test_id},
    )
    described = {
        n: {"dtype": safetensors_io.dtype_name(t), "shape": list(t.shape)} for n, t in sorted(tensors.items())
    }
    return {
        "id": step.test_id,
        "test": step.test_id,
        "file": name,
        "sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest(),
        "clauses": clauses,
        "case": case.describe(),
        "dtype": str(step.dtype).removeprefix("torch."),
        "pin_at": step.pin_at,
        "options": dict(step.options),
        "parameters": parameters,
        "without_gradient": [n for n in case.start if case.grads.get(n) is None],
        "tensors": described,
    }


def _counters(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if type(v) is int}


def _parameter(tensors: dict, s, bounds, codebook) -> dict:
    """Add one parameter's tensors to ``tensors``; its manifest entry."""
    import numpy as np

    from gefen_oracles import safetensors_io, vector_check

    n = s.name
    shape = tuple(s.p0.shape)
    tensors[f"{n}.param"] = _array(s.p0)
    tensors[f"{n}.grad"] = _array(s.grad)
    hyper = {
        "lr": s.lr,
        "beta1": s.beta1,
        "beta2": s.beta2,
        "eps": s.eps,
        "weight_decay": s.weight_decay,
        "bc1": bounds.bc1,
        "bc2": bounds.bc2,
    }
    for key, value in hyper.items():
        tensors[f"{n}.{key}"] = np.array(value, dtype=np.float64)
    state_keys = ("m_codebook", "m_magnitude", *bounds.moments)
    for key in ("m_codebook", "m_magnitude", "vmean", "v_row", "v_col"):
        if _is_tensor(s.before.get(key)):
            tensors[f"{n}.before.{key}"] = _array(s.before[key])
    for key in state_keys:
        tensors[f"{n}.reference.{key}"] = _array(s.after[key])
    tensors[f"{n}.reference.param"] = _array(s.p1)
    for key, (exact, allowed) in bounds.moments.items():
        tensors[f"{n}.expected.{key}"] = _f64(exact)
        tensors[f"{n}.allowed.{key}"] = _f64(allowed)
    tensors[f"{n}.expected.m_magnitude"] = _f64(bounds.magnitude[0])
    tensors[f"{n}.allowed.m_magnitude"] = _f64(bounds.magnitude[1])
    tensors[f"{n}.expected.codeword"] = _f64(bounds.codeword[0])
    tensors[f"{n}.allowed.codeword"] = _f64(bounds.codeword[1])
    rate, decayed, rounding = (_f64(t.reshape(shape)) for t in (bounds.rate, bounds.decayed, bounds.rounding))
    tensors[f"{n}.update.rate"] = rate
    tensors[f"{n}.update.decayed"] = decayed
    tensors[f"{n}.update.rounding"] = rounding
    tensors[f"{n}.update.rtol"] = np.array(bounds.update_rtol, dtype=np.float64)
    index = s.after["m_codebook"].long()
    codewords = codebook.double()[index].numpy().reshape(shape)
    magnitudes = np.broadcast_to(_f64(s.after["m_magnitude"]), index.shape).reshape(shape)
    expected, allowed = vector_check.parameter_target(
        rate, decayed, bounds.update_rtol, rounding, codewords, magnitudes
    )
    tensors[f"{n}.expected.param"] = expected
    tensors[f"{n}.allowed.param"] = allowed
    dtype, grad_dtype = (safetensors_io.dtype_name(tensors[f"{n}.{t}"]) for t in ("param", "grad"))
    results = {"param": [dtype, list(shape)]}
    for key in state_keys:
        results[key] = [vector_check.STATE_DTYPES[key], list(s.after[key].shape)]
    period = s.after["automatic_period"]
    return {
        "name": n,
        "shape": list(shape),
        "dtype": dtype,
        "grad_dtype": grad_dtype,
        "factored": s.factored,
        "period": period,
        "blocks": s.grad.numel() // period,
        "hyperparameters": hyper,
        "update_rtol": bounds.update_rtol,
        "before": _counters(s.before),
        "after": _counters(s.after),
        "moments": list(bounds.moments),
        "results": results,
    }


def _is_tensor(value) -> bool:
    import torch

    return torch.is_tensor(value)


def _f64(t):
    import numpy as np

    return np.ascontiguousarray(t.detach().cpu().double().numpy(), dtype=np.float64)


def _array(t):
    """A CPU tensor as the numpy array :func:`gefen_oracles.safetensors_io.write` takes (bf16 as
    ``ml_dtypes.bfloat16``, its bits unchanged)."""
    import torch

    from gefen_oracles import safetensors_io

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(safetensors_io.BFLOAT16)
    return t.numpy()
