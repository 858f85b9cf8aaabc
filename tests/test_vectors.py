"""Test vectors (SPEC 4.5.8): ``gefen-conformance vectors export DIR`` writes the certify profile's
pinned steps as safetensors files and a manifest; ``vectors check DIR RESULTS`` judges a kernel's
results against their per-element bounds without torch or pytest; ``examples/vector-check-c``
reads one vector in C99 and checks a scalar loop of the update against it."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gefen_conformance import cli, vectors
from gefen_conformance.suite import pinned_steps, test_optimizer
from gefen_conformance.workload import models, runs
from gefen_oracles import pinned_step, safetensors_io, vector_check

REPO = Path(__file__).resolve().parents[1]
C_EXAMPLE = REPO / "examples" / "vector-check-c" / "vector_check.c"
FP32 = "test_optimizer.py::test_pinned_block_step[plain-torch.float32-pinned-after-3]"
BF16_WD = "test_optimizer.py::test_pinned_block_step[wd-tensor-lr-torch.bfloat16-pinned-after-3]"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("vectors") / "out"
    assert cli.main(["vectors", "export", str(directory)]) == 0
    return directory


def _manifest(directory: Path) -> dict:
    return json.loads((directory / vector_check.MANIFEST).read_text())


def _entry(directory: Path, vector_id: str) -> dict:
    return next(e for e in _manifest(directory)["vectors"] if e["id"] == vector_id)


def _tensors(directory: Path, vector_id: str) -> dict:
    return safetensors_io.read(directory / _entry(directory, vector_id)["file"])[0]


def _reference_results(directory: Path, out: Path, counters: bool = True) -> Path:
    """A results directory holding the reference's own outputs of every vector."""
    out.mkdir(parents=True, exist_ok=True)
    for entry in _manifest(directory)["vectors"]:
        tensors = safetensors_io.read(directory / entry["file"])[0]
        results = {}
        for param in entry["parameters"]:
            n = param["name"]
            for key in param["results"]:
                results[f"{n}.{key}"] = tensors[f"{n}.reference.{key}"]
            if counters:
                for counter, value in param["after"].items():
                    if counter != "automatic_period":
                        results[f"{n}.{counter}"] = np.array(value, dtype=np.int64)
        safetensors_io.write(out / entry["file"], results)
    return out


def _replace(path: Path, name: str, array) -> None:
    """Rewrite one tensor of a safetensors file."""
    tensors, metadata = safetensors_io.read(path)
    tensors[name] = array
    safetensors_io.write(path, tensors, metadata)


def _check(capsys, directory: Path, results: Path, *extra: str) -> tuple[int, str]:
    status = cli.main(["vectors", "check", str(directory), str(results), *extra])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


# ------------------------------------------------------------------------------------ the format


def test_the_writer_round_trips_every_dtype_and_writes_the_format(tmp_path):
    """safetensors reads what the writer wrote, bit for bit (bfloat16 as ``ml_dtypes.bfloat16``); and
    the file is the format read by hand: 8-byte little-endian header length, a JSON header padded to
    8 bytes, offsets contiguous in name order, the raw little-endian bytes."""
    rng = np.random.default_rng(5)
    arrays = {
        "f64": rng.standard_normal((3, 4)),
        "f32": rng.standard_normal(7).astype(np.float32),
        "f16": rng.standard_normal((2, 2)).astype(np.float16),
        "u8": rng.integers(0, 256, (5, 3), dtype=np.uint8),
        "i64": np.array(-9, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    bits = torch.randn(6).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    path = tmp_path / "t.safetensors"
    safetensors_io.write(path, {**arrays, "bf16": bits.view(safetensors_io.BFLOAT16)}, {"k": "v"})
    tensors, metadata = safetensors_io.read(path)
    assert metadata == {"k": "v"}
    for name, array in arrays.items():
        assert tensors[name].dtype == array.dtype and tensors[name].shape == array.shape
        assert tensors[name].tobytes() == array.tobytes()
    assert safetensors_io.dtype_name(tensors["bf16"]) == "BF16"
    assert np.array_equal(tensors["bf16"].view(np.uint16), bits)
    widened = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16).double().numpy()
    assert np.array_equal(tensors["bf16"].astype(np.float64), widened)

    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    assert size % 8 == 0
    header = json.loads(raw[8 : 8 + size])
    assert header.pop("__metadata__") == {"k": "v"}
    offset = 0
    for name in sorted(header):
        begin, end = header[name]["data_offsets"]
        assert begin == offset
        offset = end
    assert 8 + size + offset == len(raw)
    begin, end = header["f64"]["data_offsets"]
    assert raw[8 + size + begin : 8 + size + end] == arrays["f64"].astype("<f8").tobytes()


@pytest.mark.parametrize(
    "damage,needle",
    [
        (lambda raw: raw[:5], "header ?too ?small"),
        (lambda raw: struct.pack("<Q", 10**9) + raw[8:], "header ?too ?large"),
        (lambda raw: raw[:8] + b"[" + raw[9:], "invalid ?json|InvalidHeaderDeserialization"),
        (lambda raw: raw[:-4], "not fully covered|MetadataIncompleteBuffer"),
    ],
    ids=["truncated-length", "long-header", "bad-json", "truncated-data"],
)
def test_the_reader_names_the_file_and_what_is_wrong_with_it(tmp_path, damage, needle):
    """safetensors' check of the header and offsets, its words, after the file's name."""
    path = tmp_path / "t.safetensors"
    safetensors_io.write(path, {"a": np.arange(4, dtype=np.float32)})
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(safetensors_io.SafetensorsError) as raised:
        safetensors_io.read(path)
    assert str(raised.value).startswith(f"{path}: not a readable safetensors file: ")
    assert re.search(needle, str(raised.value), re.I), raised.value


# ------------------------------------------------------------------------------------------ export


def test_export_writes_every_pinned_step_of_the_suite_with_its_manifest(exported):
    from gefen_conformance.certificate.build import suite_facts

    manifest = _manifest(exported)
    assert manifest["schema"] == {"name": "gefen-test-vectors", "version": 1}
    assert manifest["suite"]["content_sha256"] == suite_facts(git=False)["content_sha256"]
    assert manifest["profile"] == "tolerance"
    assert {"4.5.8", "5.6.3", "5.6.4", "5.6.6", "5.6.8"} <= set(manifest["clauses"])
    assert {"param", "codeword", "m_magnitude", "not here"} <= set(manifest["bounds"])
    # the vectors are the suite's pinned steps, by test id, in collection order
    ids = [e["id"] for e in manifest["vectors"]]
    assert ids == [step.test_id for step in pinned_steps.PINNED_STEPS] and len(ids) == 15
    pinned_tests = {name for name in dir(test_optimizer) if name.startswith("test_pinned_")}
    assert {step.test for step in pinned_steps.PINNED_STEPS} == pinned_tests
    for name in pinned_tests:  # a vector carries its test's clauses, as the test's mark names them
        marks = getattr(test_optimizer, name).pytestmark
        clauses = [c for m in marks if m.name == "gefen_clause" for c in m.args]
        assert clauses == list(pinned_steps.CLAUSES[name])
    for entry in manifest["vectors"]:
        assert entry["clauses"] and "5.6" in entry["clauses"]
        tensors = safetensors_io.read(exported / entry["file"])[0]
        dtype = safetensors_io.dtype_name
        described = {n: {"dtype": dtype(a), "shape": list(a.shape)} for n, a in tensors.items()}
        assert described == entry["tensors"]
        import hashlib

        assert hashlib.sha256((exported / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]
        for param in entry["parameters"]:
            assert set(param["hyperparameters"]) == {
                "lr",
                "beta1",
                "beta2",
                "eps",
                "weight_decay",
                "bc1",
                "bc2",
            }
            assert param["after"]["step"] == param["before"].get("step", 0) + 1
    assert _entry(exported, "test_optimizer.py::test_pinned_block_step[plain-torch.float32-pinned-codebook]")[
        "without_gradient"
    ] == ["late"]


@pytest.mark.parametrize(
    "vector_id", [FP32, BF16_WD, "test_optimizer.py::test_pinned_factored_step[torch.float16]"]
)
def test_a_vector_holds_the_references_step_and_the_oracles_bounds(exported, vector_id):
    """Read back, a vector's inputs and state are the suite case's, its after-state and parameters
    the reference's step on them, and its bounds the oracle's for that step, element for element."""
    step = next(s for s in pinned_steps.PINNED_STEPS if s.test_id == vector_id)
    case = step.case()
    reference = case.run(models.REFERENCE)
    codebook = case.state_dict["gefen_codebook"]
    tensors = _tensors(exported, vector_id)

    def same(name, tensor):
        got = tensors[name]
        if tensor.dtype == torch.bfloat16:
            assert safetensors_io.dtype_name(got) == "BF16"
            assert np.array_equal(got.view(np.uint16), tensor.view(torch.int16).numpy().view(np.uint16)), name
        else:
            assert np.array_equal(got, tensor.numpy()), name

    same("codebook", codebook.to(torch.float32))
    checked = 0
    for s in runs.param_steps(case.state_dict, reference, factored=case.factored):
        n = s.name
        same(f"{n}.param", case.start[n])
        same(f"{n}.grad", case.grads[n])
        same(f"{n}.reference.param", reference.after[n])
        for key in ("m_codebook", "m_magnitude", "vmean", "v_row", "v_col"):
            if key in s.after:
                same(f"{n}.reference.{key}", s.after[key])
            if torch.is_tensor(s.before.get(key)):
                same(f"{n}.before.{key}", s.before[key])
        bounds = pinned_step.element_bounds(s, codebook)
        for key, (exact, allowed) in bounds.moments.items():
            assert np.array_equal(tensors[f"{n}.expected.{key}"], exact.numpy())
            assert np.array_equal(tensors[f"{n}.allowed.{key}"], allowed.numpy())
        assert np.array_equal(tensors[f"{n}.allowed.codeword"], bounds.codeword[1].numpy())
        assert np.array_equal(tensors[f"{n}.update.rate"].reshape(-1), bounds.rate.numpy())
        assert float(tensors[f"{n}.lr"]) == s.lr and float(tensors[f"{n}.bc2"]) == bounds.bc2
        checked += 1
    assert checked == len(_entry(exported, vector_id)["parameters"]) >= 8


def test_the_parameters_rounding_allowance_is_the_suites_or_wider():
    """The one bound a vector fixes that the oracle forms from the implementation's own step: the
    parameter's rounding, taken at the largest parameter any admitted codeword and magnitude aim
    at. Never below the oracle's for the reference's step, and within 1% of it at nearly every element
    (3.6% of the elements here are not: a bf16 magnitude may move the parameter across a binade)."""
    from gefen_oracles import kernel_bounds

    step = next(s for s in pinned_steps.PINNED_STEPS if s.test_id == BF16_WD)
    case = step.case()
    codebook = case.state_dict["gefen_codebook"]
    wider = total = 0
    for s in runs.param_steps(case.state_dict, case.run(models.REFERENCE), factored=False):
        bounds = pinned_step.element_bounds(s, codebook)
        momentum = codebook.double()[s.after["m_codebook"].long()] * s.after["m_magnitude"].double()
        aimed_at = bounds.decayed - bounds.rate * momentum.reshape(-1)
        own = kernel_bounds.parameter_rounding(
            s.p0.double().reshape(-1), aimed_at, s.p0.dtype, s.weight_decay > 0
        )
        assert bool((bounds.rounding >= own).all()), s.name
        wider += int((bounds.rounding > 1.01 * own).sum())
        total += own.numel()
    assert wider < 0.05 * total, (wider, total)


def test_export_refuses_a_directory_it_did_not_write_before_any_work(tmp_path, capsys):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    through_a_file = tmp_path / "file"
    through_a_file.write_text("x")
    for target, needle in (
        (theirs, "holds files and is not a vectors directory"),
        (through_a_file / "sub", "is not a directory"),
        (through_a_file, "not a directory"),
    ):
        started = time.monotonic()
        status = cli.main(["vectors", "export", str(target)])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 4 and len(err) == 1 and needle in err[0], err
        assert time.monotonic() - started < 5
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]


def test_export_replaces_its_own_earlier_vectors_and_nothing_else(exported, tmp_path):
    again = tmp_path / "again"
    shutil.copytree(exported, again)
    (again / "results-of-mine.txt").write_text("kept")
    stale = _manifest(again)
    stale["vectors"].append(dict(stale["vectors"][0], file="a-stale-vector.safetensors"))
    (again / vector_check.MANIFEST).write_text(json.dumps(stale))
    (again / "a-stale-vector.safetensors").write_bytes(b"old")
    assert vectors.refusal(again) is None
    vectors.export(again)
    assert not (again / "a-stale-vector.safetensors").exists()
    assert (again / "results-of-mine.txt").read_text() == "kept"
    assert _manifest(again)["vectors"] == _manifest(exported)["vectors"]


# ------------------------------------------------------------------------------------------- check


def test_check_passes_the_references_outputs_without_torch_or_pytest(exported, tmp_path):
    """In a fresh interpreter where torch cannot be imported, the check reads every vector (bf16
    ones included) and passes them, and imports neither torch (so no torch.distributed) nor pytest."""
    results = _reference_results(exported, tmp_path / "results")
    probe = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'torch':\n"
        "            raise ModuleNotFoundError(f'{name} is made unimportable here')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from gefen_conformance import cli\n"
        f"status = cli.main(['vectors', 'check', {str(exported)!r}, {str(results)!r}])\n"
        "heavy = ('torch', 'torch.distributed', 'pytest', '_pytest')\n"
        "loaded = sorted(m for m in heavy if m in sys.modules)\n"
        "print('loaded:', loaded)\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "loaded: []" in done.stdout
    assert "15 of 15 vectors passed" in done.stdout


def test_check_fails_a_perturbed_result_and_names_the_element(exported, tmp_path, capsys):
    results = _reference_results(exported, tmp_path / "results")
    entry = _entry(exported, FP32)
    wrong = safetensors_io.read(results / entry["file"])[0]["weight.param"].copy()
    wrong[5, 7] *= 1.001
    _replace(results / entry["file"], "weight.param", wrong)
    status, out = _check(capsys, exported, results)
    assert status == 1
    assert "14 of 15 vectors passed" in out
    assert f"FAIL {FP32}" in out
    assert "weight.param: the update given the codewords (SPEC 5.6.8): 1 of 1920 elements outside" in out
    expected = _tensors(exported, FP32)["weight.expected.param"][5, 7]
    assert f"[5, 7] expected {expected:.9g}, observed {float(wrong[5, 7]):.9g}" in out


def _just(expected: float, allowed: float, share: float, dtype) -> float:
    """``expected + share * allowed`` in ``dtype``, asserted to land on the intended side."""
    value = np.array(expected + share * allowed, dtype=dtype)
    inside = abs(float(value) - expected) <= allowed
    assert inside == (abs(share) < 1), (expected, allowed, share, float(value))
    return value


@pytest.mark.parametrize("quantity", ["vmean", "m_magnitude", "param"])
def test_a_result_just_inside_its_bound_passes_and_just_outside_fails(exported, tmp_path, capsys, quantity):
    """Not bitwise the reference's: an element at 0.9 of its bound passes, at 1.1 it fails, and
    the failure names that element."""
    tensors = _tensors(exported, FP32)
    expected = tensors[f"weight.expected.{quantity}"]
    allowed = tensors[f"weight.allowed.{quantity}"]
    # where the bound is widest against fp32's spacing, so that rounding to fp32 keeps the side
    flat = int(np.argmax(allowed / np.spacing(np.abs(expected).astype(np.float32)).astype(np.float64)))
    index = np.unravel_index(flat, expected.shape)
    for share, status in ((0.9, 0), (-0.9, 0), (1.1, 1), (-1.1, 1)):
        results = _reference_results(exported, tmp_path / f"r{share}")
        name = f"weight.{quantity}"
        observed = safetensors_io.read(results / _entry(exported, FP32)["file"])[0][name].copy()
        observed[index] = _just(float(expected[index]), float(allowed[index]), share, np.float32)
        _replace(results / _entry(exported, FP32)["file"], name, observed)
        got, out = _check(capsys, exported, results, "--vector", FP32)
        assert got == status, out
        if status:
            assert f"FAIL {name}" in out and f"[{', '.join(str(int(i)) for i in index)}] expected" in out


def test_the_parameter_is_judged_with_the_kernels_own_codewords(exported, tmp_path, capsys):
    """A wrong codeword fails the codeword check alone when the parameter follows from it: the
    update is judged given the kernel's codewords and magnitudes (SPEC 5.6.8), not the reference's."""
    results = _reference_results(exported, tmp_path / "results")
    path = results / _entry(exported, FP32)["file"]
    vector = _tensors(exported, FP32)
    got = safetensors_io.read(path)[0]
    index = got["vector.m_codebook"].copy()
    block, k = 0, 5
    index[block, k] = index[block, k] + 40
    codewords = vector["codebook"].astype(np.float64)[index.astype(np.int64)].reshape(256)
    magnitudes = np.repeat(got["vector.m_magnitude"].astype(np.float64).reshape(-1), index.shape[1])
    target, _ = vector_check.parameter_target(
        vector["vector.update.rate"],
        vector["vector.update.decayed"],
        float(vector["vector.update.rtol"]),
        vector["vector.update.rounding"],
        codewords,
        magnitudes,
    )
    _replace(path, "vector.m_codebook", index)
    _replace(path, "vector.param", target.astype(np.float32))
    status, out = _check(capsys, exported, results, "--vector", FP32)
    assert status == 1
    assert "FAIL vector.m_codebook: codebook[index] (SPEC 5.6.6): 1 of 256 elements outside" in out
    assert f"[{block}, {k}] expected" in out
    assert "FAIL vector.param" not in out


def test_check_reports_structure_counters_nan_and_missing_results(exported, tmp_path, capsys):
    results = _reference_results(exported, tmp_path / "results")
    fp32 = results / _entry(exported, FP32)["file"]
    _replace(fp32, "weight.m_magnitude", np.zeros((5, 1), dtype=np.float32))
    _replace(fp32, "vector.step", np.array(7, dtype=np.int64))
    shape = safetensors_io.read(fp32)[0]["prime.vmean"].shape
    _replace(fp32, "prime.vmean", np.full(shape, np.nan, dtype=np.float32))
    (results / _entry(exported, BF16_WD)["file"]).unlink()
    status, out = _check(capsys, exported, results)
    assert status == 1 and "13 of 15 vectors passed" in out
    assert "weight.m_magnitude: F32 [5, 1], expected F32 [" in out
    assert "vector.step: [7] (I64), expected 4 (exact)" in out
    assert f"{int(np.prod(shape))} of {int(np.prod(shape))} elements NaN; the reference is finite" in out
    assert "no results file" in out


def test_check_usage_errors_exit_4_and_unreadable_files_exit_2(exported, tmp_path, capsys):
    results = _reference_results(exported, tmp_path / "results")
    for words, needle in (
        ((str(tmp_path / "none"), str(results)), "is not a directory"),
        ((str(exported), str(tmp_path / "none")), "is not a directory"),
        ((str(exported), str(results), "--vector", "test_nothing.py::x"), "no vector"),
    ):
        status, out = _check(capsys, *words)
        assert status == 4 and needle in out, out
    torn = tmp_path / "torn"
    shutil.copytree(results, torn)
    path = torn / _entry(exported, FP32)["file"]
    path.write_bytes(path.read_bytes()[:100])
    status, out = _check(capsys, exported, torn)
    assert status == 2 and "not a readable safetensors file" in out, out
    assert len(out.strip().splitlines()) == 1, out
    other = tmp_path / "other"
    other.mkdir()
    (other / vector_check.MANIFEST).write_text('{"schema": {"name": "something-else"}}')
    status, out = _check(capsys, other, results)
    assert status == 2 and "not a gefen-test-vectors manifest" in out


# ------------------------------------------------------------------------------------ the C example


@pytest.fixture(scope="module")
def c_checker(tmp_path_factory) -> Path:
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler (`cc`) on this machine: the C example cannot be built")
    binary = tmp_path_factory.mktemp("c") / "vector_check"
    done = subprocess.run(
        [
            compiler,
            "-std=c99",
            "-O2",
            "-Wall",
            "-Wextra",
            "-pedantic",
            "-o",
            str(binary),
            str(C_EXAMPLE),
            "-lm",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    return binary


def _run_c(binary: Path, path: Path, names) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), str(path), *names], capture_output=True, text=True, timeout=60)


def _block_parameters(entry: dict) -> list[str]:
    return [p["name"] for p in entry["parameters"] if p["moments"] == ["vmean"]]


def test_the_c_example_passes_every_exported_block_update(exported, c_checker):
    """Built with the system compiler, the C99 scalar loop (fp32 arithmetic, one rounding to the
    parameter's dtype) is within every element's bound of every vector: fp32, bf16 and fp16
    parameters, with and without weight decay, fresh and warm states."""
    for entry in _manifest(exported)["vectors"]:
        names = _block_parameters(entry)
        done = _run_c(c_checker, exported / entry["file"], names)
        assert done.returncode == 0, entry["id"] + "\n" + done.stdout[-2000:] + done.stderr
        assert done.stdout.count("PASS") == len(names) >= 6


def test_the_c_example_fails_a_perturbed_vector_and_names_the_element(exported, c_checker, tmp_path):
    entry = _entry(exported, BF16_WD)
    perturbed = tmp_path / entry["file"]
    shutil.copy(exported / entry["file"], perturbed)
    tensors = safetensors_io.read(perturbed)[0]
    expected = tensors["conv.expected.param"].copy()
    allowed = tensors["conv.allowed.param"]
    expected[1, 2, 0, 1] += 3 * allowed[1, 2, 0, 1]
    _replace(perturbed, "conv.expected.param", expected)
    done = _run_c(c_checker, perturbed, _block_parameters(entry))
    assert done.returncode == 1, done.stdout
    flat = int(np.ravel_multi_index((1, 2, 0, 1), expected.shape))
    assert f"conv[{flat}]: expected" in done.stdout
    assert "FAIL conv: 1 of 216 elements outside their bounds" in done.stdout

    # a wrong input (lr off by 1%) moves every update out of its bound
    shutil.copy(exported / entry["file"], perturbed)
    _replace(perturbed, "vector.lr", np.array(float(tensors["vector.lr"]) * 1.01))
    done = _run_c(c_checker, perturbed, ["vector"])
    assert done.returncode == 1 and "FAIL vector" in done.stdout, done.stdout


def test_the_c_example_refuses_what_it_cannot_read(exported, c_checker, tmp_path):
    entry = _entry(exported, FP32)
    torn = tmp_path / "torn.safetensors"
    torn.write_bytes((exported / entry["file"]).read_bytes()[:64])
    assert _run_c(c_checker, torn, ["vector"]).returncode == 2
    done = _run_c(c_checker, exported / entry["file"], ["no_such_parameter"])
    assert done.returncode == 2 and "no_such_parameter.param: not in the vector" in done.stderr
    assert _run_c(c_checker, exported / entry["file"], []).returncode == 2


# ------------------------------------------------------- kernels: benign variants and mutants


def _kernel_results(make_optimizer, out: Path) -> Path:
    """The results files of the implementation ``make_optimizer`` builds, stepped from every
    vector's inputs (the suite's cases, which the vectors hold)."""
    from gefen_conformance import vectors as vectors_cli

    out.mkdir(parents=True)
    for step in pinned_steps.PINNED_STEPS:
        case = step.case()
        ran = case.run(make_optimizer)
        results = {}
        for s in runs.param_steps(case.state_dict, ran, factored=case.factored):
            results[f"{s.name}.param"] = vectors_cli._array(s.p1)
            for key in ("m_codebook", "m_magnitude", "vmean", "v_row", "v_col"):
                if key in s.after:
                    results[f"{s.name}.{key}"] = vectors_cli._array(s.after[key])
        safetensors_io.write(out / vectors.file_name(step.test_id), results)
    return out


def _pinned_step_mutants() -> dict:
    """The catalogue's mutants the suite catches on a pinned block step under the tolerance profile."""
    from tests import mutants

    return {
        name: entry.implementation
        for name, entry in mutants.CATALOGUE.items()
        if "pinned_block_step" in (entry.select_in(mutants.TOLERANCE) or "")
    }


def _judged(capsys, exported: Path, tmp_path: Path, name: str, implementation) -> tuple[int, str]:
    return _check(capsys, exported, _kernel_results(implementation.make_optimizer, tmp_path / name))


#: A benign variant of every stage a pinned step's vectors bound, and a mutant, for the default run.
QUICK_BENIGN = ("fp32-master-math", "reciprocal-multiply", "separate-multiply-add")


@pytest.mark.parametrize(
    "names",
    [pytest.param(QUICK_BENIGN, id="quick"), pytest.param(None, id="catalogue", marks=pytest.mark.slow)],
)
def test_the_vectors_pass_the_benign_variants_and_fail_the_pinned_step_mutants(
    exported, tmp_path, capsys, names
):
    """The kernel team's loop without the suite: benign variants (tests/benign.py, rounding only)
    pass every vector; the mutants the suite's pinned block step catches under the tolerance
    profile fail one at least. ``catalogue``: every benign variant and every such mutant."""
    from tests import benign

    for name in names or benign.CATALOGUE:
        status, out = _judged(
            capsys, exported, tmp_path, f"benign-{name}", benign.CATALOGUE[name].implementation
        )
        assert status == 0, f"{name}:\n{out[-3000:]}"
    found = _pinned_step_mutants()
    assert {"lr-half-percent-high", "no-weight-decay", "eps-inside-sqrt"} <= set(found)
    for name in sorted(found) if names is None else ["lr-half-percent-high"]:
        status, out = _judged(capsys, exported, tmp_path, f"mutant-{name}", found[name])
        assert status == 1 and "elements outside their bounds" in out, f"{name}:\n{out[-3000:]}"
