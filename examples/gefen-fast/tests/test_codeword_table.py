"""The codeword table answers exactly as the nearest-codeword rule (SPEC 1.7), in numpy and in the C
lookups."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gefen_reference as reference
from gefen_fast import codeword_table, kernels, native
from gefen_reference.codewords import nearest_codeword_indices


def _learned_codebook(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.zeros(256, 512))
    p.grad = torch.randn(256, 512, generator=g) * (1 + torch.arange(512) % 7)
    opt = reference.Gefen([("w", p)], factored_v_2d=False)
    opt.step()
    return opt.codebook


CODEBOOKS = {
    "learned": lambda: _learned_codebook(0),
    "learned-other": lambda: _learned_codebook(1),
    "linspace": lambda: torch.linspace(-1, 1, 256),
    "padding": lambda: torch.tensor([-1.0] + [1 / 4096] * 254 + [1.0]),
    "duplicates": lambda: torch.tensor([-1.0, -0.5, 0.25] + [0.5] * 252 + [1.0]),
}


def _probes(codebook: torch.Tensor) -> torch.Tensor:
    points, _ = codeword_table.change_points(codebook.numpy())
    t = torch.tensor(np.asarray(points, dtype=np.float32))
    up, down = torch.nextafter(t, torch.tensor(2.0)), torch.nextafter(t, torch.tensor(-2.0))
    g = torch.Generator().manual_seed(7)
    edges = torch.tensor([-1.0, -0.0, 0.0, 1.0, 1 / 4096, 0.0003, 0.5, -0.5])
    return torch.cat(
        [
            torch.rand(200_000, generator=g) * 2 - 1,
            edges,
            codebook,
            t,
            up,
            down,
            (codebook[1:] + codebook[:-1]) / 2,
        ]
    ).clamp(-1, 1)


@pytest.mark.parametrize("name", list(CODEBOOKS))
def test_table_matches_the_rule(name):
    codebook = CODEBOOKS[name]()
    table = codeword_table.build(codebook)
    assert table.use_cells, "a learned or simple codebook must get a one-comparison table"
    values = _probes(codebook)
    expected = nearest_codeword_indices(codebook, values).numpy()
    assert np.array_equal(table.indices(values.numpy()), expected)


def test_rule_in_numpy_matches_the_reference():
    codebook = _learned_codebook(3)
    values = _probes(codebook)
    assert np.array_equal(
        codeword_table.rule_indices(codebook.numpy(), values.numpy()),
        nearest_codeword_indices(codebook, values).numpy(),
    )


def test_crowded_codebook_uses_the_search():
    """Codewords closer than a cell: the table says so, and the kernels then search (see test_kernels)."""
    crowded = torch.linspace(-1, 1, 256)
    crowded[100:110] = crowded[100] + torch.arange(10) * 1e-5
    assert not codeword_table.build(crowded).use_cells


def test_spec_worked_examples():
    """SPEC 1.7.2: linspace ties go low; the padding codebook's run picks its ends."""
    lin = codeword_table.build(torch.linspace(-1, 1, 256))
    assert lin.indices(np.float32([0.0]))[0] == 127
    pad = codeword_table.build(torch.tensor([-1.0] + [1 / 4096] * 254 + [1.0]))
    got = pad.indices(np.float32([0.0, 1 / 4096, 0.0003, 0.5, -0.5]))
    assert got.tolist() == [1, 1, 254, 254, 0]


def _c_lookup(codebook: torch.Tensor, values: np.ndarray, grad_dtype=torch.float32):
    tables = kernels.CodewordTables()
    table = tables.get(codebook, grad_dtype)
    v = np.ascontiguousarray(values, dtype=np.float32)
    codes = np.empty(len(v), dtype=np.uint8)
    decoded = np.empty(len(v), dtype=np.float32)
    native.library().gefen_nearest_codes(v.ctypes.data, len(v), table, codes.ctypes.data, decoded.ctypes.data)
    return codes, decoded, table.use_cells


CROWDED = torch.linspace(-1, 1, 256)
CROWDED[120:136] = CROWDED[120] + torch.arange(16) * 1e-5


@pytest.mark.parametrize("name", list(CODEBOOKS) + ["crowded"])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_c_lookup_matches_the_rule(name, grad_dtype):
    """The kernels' vector lookup (8 at a time) and scalar tail give the rule's index and the
    codeword rounded to the gradient dtype, at every change point and its neighbours."""
    codebook = CROWDED.clone() if name == "crowded" else CODEBOOKS[name]()
    values = _probes(codebook).numpy()
    values = np.concatenate([values, values[:3]])  # a length that leaves a scalar tail
    codes, decoded, use_cells = _c_lookup(codebook, values, grad_dtype)
    assert use_cells == (name != "crowded")
    expected = nearest_codeword_indices(codebook, torch.from_numpy(values)).numpy()
    assert np.array_equal(codes, expected)
    rounded = codebook.to(grad_dtype).float().numpy()
    assert np.array_equal(decoded, rounded[expected])


def test_c_lookup_sends_nan_to_the_last_index():
    """SPEC 1.7.4: NaN maps to 255, in the vector lanes and in the tail."""
    for codebook in (_learned_codebook(0), CROWDED.clone()):
        values = np.array([0.1, np.nan, -0.3, 1.0, -1.0, np.nan, 0.0, -0.0, np.nan], dtype=np.float32)
        codes, _, _ = _c_lookup(codebook, values)
        expected = nearest_codeword_indices(codebook, torch.from_numpy(values)).numpy()
        assert codes[1] == codes[5] == codes[8] == 255
        assert np.array_equal(codes, expected)


def test_byte_planes_reassemble_the_decoded_codewords():
    """Plane b holds byte b of every decoded codeword (the 16-lane loops' byte-permute decode)."""
    decode = np.linspace(-1, 1, 256, dtype=np.float32) ** 3
    decode[7] = np.float32(-0.0)
    planes = codeword_table.byte_planes(decode)
    assert planes.shape == (4, 256) and planes.dtype == np.uint8 and planes.flags.c_contiguous
    words = sum(planes[b].astype(np.uint32) << (8 * b) for b in range(4))
    assert np.array_equal(words, decode.view(np.uint32))
    with pytest.raises(ValueError, match="256 codewords"):
        codeword_table.byte_planes(decode[:255])
