"""The numeric oracle catches what it claims to (SPEC 5.3)."""

import torch

from oracles.numeric import bitwise_mismatch, tolerance_mismatch


def test_bitwise_catches_one_ulp_signed_zero_dtype_and_shape():
    x = torch.randn(100)
    y = x.clone()
    y[37] = torch.nextafter(y[37], torch.tensor(10.0))
    m = bitwise_mismatch("p", x, y)
    assert m is not None and "flat index 37" in str(m)
    assert bitwise_mismatch("z", torch.tensor([0.0]), torch.tensor([-0.0])) is not None
    assert bitwise_mismatch("d", x, x.double()) is not None
    assert bitwise_mismatch("s", x, x.reshape(10, 10)) is not None
    assert bitwise_mismatch("same", x, x.clone()) is None
    nan = torch.tensor([float("nan")])
    assert bitwise_mismatch("nan", nan, nan.clone()) is None


def test_tolerance_regime():
    x = torch.ones(10)
    assert tolerance_mismatch("p", x, x + 5e-6) is None
    m = tolerance_mismatch("p", x, x + 1e-2)
    assert m is not None and "outside" in str(m)
    b = torch.ones(4, dtype=torch.bfloat16)
    assert tolerance_mismatch("b", b, b * 1.01) is None
