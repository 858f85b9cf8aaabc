"""Judging a kernel's outputs against exported test vectors, on numpy without torch (SPEC 4.5.8).

A vectors directory (``gefen-conformance vectors export``) holds a manifest, :data:`MANIFEST`, and
one safetensors file per pinned step of the suite (:mod:`gefen_oracles.safetensors_io`). Each file
holds a step's inputs, the state before it, the reference's state and parameters after it, and the
per-element bounds of the tolerance profile (SPEC 5.6), computed when the vectors were written from
the same float64 arithmetic as :mod:`gefen_oracles.pinned_step` and the bounds of
:mod:`gefen_oracles.kernel_bounds`. Nothing here derives a bound: every ``allowed`` is read from the
vector, so this module imports neither torch (whose import loads ``torch.distributed``) nor pytest.

A kernel's results for one vector are one safetensors file of the same name, holding per
parameter ``NAME`` what the kernel produced: ``NAME.param``, ``NAME.m_codebook``,
``NAME.m_magnitude`` and the second moment (``NAME.vmean``, or ``NAME.v_row`` and ``NAME.v_col``),
and optionally the counters ``NAME.step`` and ``NAME.vmean_step`` or ``NAME.factored_step``. Each
is judged per element, ``|observed - expected| <= allowed``:

* the dtypes and shapes exactly (the period is in the index shape), the counters exactly;
* the second moment and the block magnitude against their exact values;
* the codeword ``codebook[index]`` against the exact normalized momentum;
* the parameter against ``decayed - rate * codeword * magnitude`` formed with the kernel's own
  codewords and magnitudes (SPEC 5.6.8 judges the update given them), within
  ``update_rtol * |rate * codeword * magnitude| + rounding``.

The update bias (SPEC 5.6.9) is a statistic over the whole step, not a per-element bound; the
suite judges it, the vectors do not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .safetensors_io import SafetensorsError, dtype_name, read

MANIFEST = "vectors.json"
SCHEMA = "gefen-test-vectors"
SCHEMA_VERSION = 1
#: How many elements outside their bound a failing check lists.
FIRST = 10
#: The safetensors dtype each state tensor of a result must have.
STATE_DTYPES = {"m_codebook": "U8", "m_magnitude": "F32", "vmean": "F32", "v_row": "F32", "v_col": "F32"}


class VectorError(Exception):
    """A vectors directory, vector or result that cannot be read (exit status 2)."""


@dataclass(frozen=True)
class Element:
    """One element outside its bound: its index in the checked tensor, the expected value, the
    kernel's, and the largest ``|observed - expected|`` allowed there."""

    index: tuple
    expected: float
    observed: float
    allowed: float

    def text(self) -> str:
        return (
            f"[{', '.join(str(i) for i in self.index)}] expected {self.expected:.9g}, observed "
            f"{self.observed:.9g}, allowed {self.allowed:.3g}"
        )


@dataclass
class Check:
    """One judged quantity of one parameter: ``outside`` of ``total`` elements outside their
    bound (or ``problem``: a structural or exact rule broken), the first of them."""

    what: str
    total: int = 0
    outside: int = 0
    problem: str = ""
    first: list = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem and not self.outside

    def lines(self) -> list[str]:
        if self.problem:
            return [f"FAIL {self.what}: {self.problem}"]
        if self.ok:
            return [f"ok   {self.what}: {self.total} elements within their bounds"]
        head = f"FAIL {self.what}: {self.outside} of {self.total} elements outside their bounds"
        out = [head + (f" ({self.note})" if self.note else "")]
        out += [f"       {e.text()}" for e in self.first]
        return out


@dataclass
class VectorResult:
    """A vector's verdict: every check of every parameter."""

    vector: str
    file: str
    checks: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def lines(self) -> list[str]:
        verdict = "PASS" if self.ok else "FAIL"
        out = [f"{verdict} {self.vector} ({self.file})"]
        shown = self.checks if not self.ok else []
        for check in shown:
            out += ["  " + line for line in check.lines()]
        return out


def load_manifest(directory) -> dict:
    """The manifest of the vectors directory ``directory``; VectorError naming what is wrong."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise VectorError(f"{path}: no such file (not a vectors directory)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise VectorError(f"{path}: cannot be read: {error}") from None
    schema = manifest.get("schema") if isinstance(manifest, dict) else None
    if not isinstance(schema, dict) or schema.get("name") != SCHEMA:
        raise VectorError(f"{path}: not a {SCHEMA} manifest")
    if schema.get("version") != SCHEMA_VERSION:
        raise VectorError(
            f"{path}: {SCHEMA} version {schema.get('version')!r}; this reader reads version {SCHEMA_VERSION}"
        )
    if not isinstance(manifest.get("vectors"), list):
        raise VectorError(f"{path}: no list of vectors")
    return manifest


def read_file(path) -> dict:
    """``{name: numpy array}`` of one safetensors file; VectorError when it cannot be read."""
    try:
        tensors, _ = read(path)
    except FileNotFoundError:
        raise VectorError(f"{path}: no such file") from None
    except (OSError, SafetensorsError) as error:
        raise VectorError(str(error) if isinstance(error, SafetensorsError) else f"{path}: {error}") from None
    return tensors


def parameter_target(
    rate: np.ndarray,
    decayed: np.ndarray,
    update_rtol: float,
    rounding: np.ndarray,
    codewords: np.ndarray,
    magnitudes: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``(expected, allowed)`` of the parameter after the step given its new codewords and
    magnitudes (each broadcast to the parameter, float64): SPEC 5.6.8's update, the bound's
    pieces read from the vector."""
    delta = rate * codewords * magnitudes
    return decayed - delta, update_rtol * np.abs(delta) + rounding


def judge(label: str, expected: np.ndarray, observed: np.ndarray, allowed: np.ndarray) -> Check:
    """``|observed - expected| <= allowed`` per element (float64 arrays of one shape); NaN fails."""
    check = Check(label, total=int(expected.size))
    error = np.abs(observed - expected)
    bad = ~(error <= allowed)
    check.outside = int(bad.sum())
    if check.outside:
        flat = np.flatnonzero(bad.reshape(-1))[:FIRST]
        for i in flat.tolist():
            index = tuple(int(k) for k in np.unravel_index(i, expected.shape)) if expected.shape else ()
            check.first.append(
                Element(
                    index,
                    float(expected.reshape(-1)[i]),
                    float(observed.reshape(-1)[i]),
                    float(allowed.reshape(-1)[i]),
                )
            )
        finite = np.isfinite(expected)
        nan = int((np.isnan(observed) & finite).sum())
        inf = int((np.isinf(observed) & finite).sum())
        if nan or inf:
            parts = [
                f"{nan} of {expected.size} elements NaN" if nan else "",
                f"{inf} infinite" if inf else "",
            ]
            check.note = ", ".join(p for p in parts if p) + "; the reference is finite"
    return check


def check_vector(entry: dict, vector: dict, results: dict) -> VectorResult:
    """Judge ``results`` (``{name: numpy array}``, the kernel's file) against one vector (its manifest
    ``entry`` and its file's tensors ``vector``)."""
    out = VectorResult(entry["id"], entry["file"])
    codebook = _values(_need(vector, "codebook", entry)).reshape(-1)
    for param in entry["parameters"]:
        out.checks += _check_parameter(param, vector, results, codebook, entry)
    return out


def _values(array: np.ndarray) -> np.ndarray:
    """``array`` as float64 (integers and booleans converted, bfloat16 and float16 widened exactly)."""
    return array.astype(np.float64)


def _need(tensors: dict, name: str, entry: dict) -> np.ndarray:
    if name not in tensors:
        raise VectorError(f"{entry['file']}: the vector lacks {name!r}")
    return tensors[name]


def _structure(param: dict, results: dict) -> list[Check]:
    """The exact rules: every result tensor present, of its dtype and shape; counters exact."""
    n, out = param["name"], []
    shapes = {f"{n}.{key}": (dtype, tuple(shape)) for key, (dtype, shape) in param["results"].items()}
    for name, (dtype, shape) in shapes.items():
        got = results.get(name)
        if got is None:
            out.append(Check(f"{name}", problem="missing from the results"))
        elif dtype_name(got) != dtype or got.shape != shape:
            out.append(
                Check(
                    f"{name}",
                    problem=f"{dtype_name(got)} {list(got.shape)}, expected {dtype} {list(shape)} (exact)",
                )
            )
    for counter, value in param["after"].items():
        got = results.get(f"{n}.{counter}")
        if got is None or counter == "automatic_period":
            continue
        dtype = dtype_name(got)
        if got.size != 1 or dtype in ("F64", "F32", "F16", "BF16") or int(got.reshape(-1)[0]) != value:
            shown = got.reshape(-1).tolist()
            out.append(Check(f"{n}.{counter}", problem=f"{shown} ({dtype}), expected {value} (exact)"))
    return out


def _check_parameter(param: dict, vector: dict, results: dict, codebook: np.ndarray, entry: dict) -> list:
    n = param["name"]
    structure = _structure(param, results)
    if structure:
        return structure

    def pair(q: str):
        expected, allowed = (_need(vector, f"{n}.{kind}.{q}", entry) for kind in ("expected", "allowed"))
        return _values(expected), _values(allowed)

    out = []
    for key in param["moments"]:
        expected, allowed = pair(key)
        out.append(
            judge(f"{n}.{key}: second moment (SPEC 5.6.3)", expected, _values(results[f"{n}.{key}"]), allowed)
        )
    expected, allowed = pair("m_magnitude")
    magnitude = _values(results[f"{n}.m_magnitude"])
    out.append(judge(f"{n}.m_magnitude: block magnitude (SPEC 5.6.4)", expected, magnitude, allowed))
    index = results[f"{n}.m_codebook"].astype(np.int64)
    codewords = codebook[index]
    expected, allowed = pair("codeword")
    out.append(judge(f"{n}.m_codebook: codebook[index] (SPEC 5.6.6)", expected, codewords, allowed))
    shape = tuple(param["shape"])
    target, bound = parameter_target(
        _values(_need(vector, f"{n}.update.rate", entry)),
        _values(_need(vector, f"{n}.update.decayed", entry)),
        float(_values(_need(vector, f"{n}.update.rtol", entry)).reshape(-1)[0]),
        _values(_need(vector, f"{n}.update.rounding", entry)),
        codewords.reshape(shape),
        np.broadcast_to(magnitude, codewords.shape).reshape(shape),
    )
    observed = _values(results[f"{n}.param"])
    out.append(judge(f"{n}.param: the update given the codewords (SPEC 5.6.8)", target, observed, bound))
    return out


def check(directory, results, vectors=None) -> list[VectorResult]:
    """Every vector of ``directory`` (or those whose id or file is in ``vectors``) judged against
    the file of the same name in ``results``; a missing result file fails its vector. VectorError
    for a manifest, vector or result that cannot be read, or an unknown vector asked for."""
    manifest = load_manifest(directory)
    entries = manifest["vectors"]
    if vectors:
        known = {e["id"] for e in entries} | {e["file"] for e in entries}
        unknown = [v for v in vectors if v not in known]
        if unknown:
            raise VectorError(f"no vector {unknown[0]!r} in {Path(directory) / MANIFEST}")
        entries = [e for e in entries if e["id"] in vectors or e["file"] in vectors]
    out = []
    for entry in entries:
        result_path = Path(results) / entry["file"]
        if not result_path.exists():
            verdict = VectorResult(entry["id"], entry["file"])
            verdict.checks.append(Check(entry["file"], problem=f"no results file {result_path}"))
            out.append(verdict)
            continue
        vector = read_file(Path(directory) / entry["file"])
        out.append(check_vector(entry, vector, read_file(result_path)))
    return out
