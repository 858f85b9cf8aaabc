"""The explicit examples of hyperparameter staging (SPEC 3.5, 4.3.9): each a pair ``(saved groups,
live destinations)`` by name.

* :data:`REGRESSIONS`: the rules the published pull request found one review at a time, and
  failing examples found while building the suite (each its own test);
* :data:`LIMITS`: one destination at each boundary the strategies draw from
  (``test_staging_matches_reference``);
* :data:`OPEN_LIMITS`: the cases SPEC 3.5.3 and 3.5.4 leave open
  (``test_staging_matches_reference_with_autograd_and_aliased_destinations``).
"""

from __future__ import annotations

import math

import torch

from gefen_conformance.suite.staging import FLOAT_DTYPES, INT_DTYPES, KEYS, Destination


def _lr_group(lr):
    return {"lr": lr, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}


_FLOAT_DESTS = {k: Destination(None, 0.0) for k in KEYS}


#: Examples that pin the rules the published pull request found one review at a time, plus
#: failing examples found while building the suite. Each runs as its own test, so one known
#: failure cannot hide the others.
REGRESSIONS = {
    # an lr restored into an integer tensor would truncate to 0 and freeze training
    "lr-into-int64": (
        [_lr_group(3e-4), _lr_group(1e-3)],
        [dict(_FLOAT_DESTS, lr=Destination(torch.int64, 0.0)), _FLOAT_DESTS],
    ),
    # a beta that rounds to 1.0 in bf16 divides by zero at the next bias correction
    "beta2-rounds-to-one-in-bf16": (
        [dict(_lr_group(1e-3), beta2=0.9999), _lr_group(1e-3)],
        [dict(_FLOAT_DESTS, beta2=Destination(torch.bfloat16, 0.999)), _FLOAT_DESTS],
    ),
    # one tensor aliased by two groups that the checkpoint gives different values
    "aliased-lr-different-values": (
        [_lr_group(1e-3), _lr_group(2e-3)],
        [
            dict(_FLOAT_DESTS, lr=Destination(torch.float32, 1e-3, alias="x")),
            dict(_FLOAT_DESTS, lr=Destination(torch.float32, 1e-3, alias="x")),
        ],
    ),
    # the same aliased tensor receiving equal values is fine
    "aliased-lr-same-value": (
        [_lr_group(1e-3), _lr_group(1e-3)],
        [
            dict(_FLOAT_DESTS, lr=Destination(torch.float32, 5e-3, alias="x")),
            dict(_FLOAT_DESTS, lr=Destination(torch.float32, 5e-3, alias="x")),
        ],
    ),
    # a leaf tensor that requires grad is filled under no_grad
    "lr-requires-grad": (
        [_lr_group(1e-3), _lr_group(1e-3)],
        [dict(_FLOAT_DESTS, lr=Destination(torch.float32, 5e-3, requires_grad=True)), _FLOAT_DESTS],
    ),
    # a huge lr overflows float16
    "lr-overflows-fp16": (
        [_lr_group(7e4), _lr_group(1e-3)],
        [dict(_FLOAT_DESTS, lr=Destination(torch.float16, 1e-3)), _FLOAT_DESTS],
    ),
    # a tiny eps underflows to zero in bf16? (bf16 shares fp32's exponent: it does not) and in fp16 (it does)
    "eps-underflows-fp16": (
        [dict(_lr_group(1e-3), eps=1e-8), _lr_group(1e-3)],
        [dict(_FLOAT_DESTS, eps=Destination(torch.float16, 1e-3)), _FLOAT_DESTS],
    ),
}


#: The boundaries of SPEC 3.5 the properties' explicit examples pin, one destination at a limit
#: each, every other entry a plain Python number (so that this destination decides): for each
#: float dtype its largest finite value and the next float above it (overflow), its smallest
#: subnormal and a quarter of it (underflow), the largest value below 1 and one that rounds to 1
#: (a beta); for each integer dtype and bool its largest value, the next integer (out of range)
#: and a fraction (truncation); one-element tensors of shape () and (1,).
_BELOW_ONE = {
    torch.float16: 1 - 2.0**-11,
    torch.bfloat16: 1 - 2.0**-8,
    torch.float32: 1 - 2.0**-24,
    torch.float64: 1 - 2.0**-53,
}
_SMALLEST = {
    torch.float16: 2.0**-24,
    torch.bfloat16: 2.0**-133,
    torch.float32: 2.0**-149,
    torch.float64: 2.0**-1074,
}
_LARGEST_INT = {
    torch.int8: 127.0,
    torch.int16: 32767.0,
    torch.int32: 2.0**31 - 1,
    torch.int64: 2.0**63 - 1024,
    torch.uint8: 255.0,
    torch.bool: 1.0,
}
_PLAIN_GROUP = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}


def _at_limit(key: str, value: float, dtype: torch.dtype, shape: tuple = (), group: int = 0) -> tuple:
    saved = [dict(_PLAIN_GROUP), dict(_PLAIN_GROUP)]
    saved[group][key] = value
    dests = [dict(_FLOAT_DESTS), dict(_FLOAT_DESTS)]
    dests[group] = dict(
        dests[group], **{key: Destination(dtype, 1.0 if dtype.is_floating_point else 0.0, shape)}
    )
    return saved, dests


def _limits() -> dict:
    cases = {}
    for i, dtype in enumerate(FLOAT_DTYPES):
        name, shape, group = str(dtype).replace("torch.", ""), ((), (1,))[i % 2], i % 2
        largest = torch.finfo(dtype).max
        cases[f"{name}-largest"] = _at_limit("lr", largest, dtype, shape, group)
        if dtype != torch.float64:  # above fp64's largest is not a finite saved value
            cases[f"{name}-above-largest"] = _at_limit(
                "weight_decay", math.nextafter(largest, math.inf), dtype, shape
            )
            cases[f"{name}-quarter-subnormal"] = _at_limit("eps", _SMALLEST[dtype] / 4, dtype, (), 1 - group)
            cases[f"{name}-beta-rounds-to-one"] = _at_limit(
                "beta2", 1 - (1 - _BELOW_ONE[dtype]) / 4, dtype, shape
            )
        cases[f"{name}-smallest-subnormal"] = _at_limit("eps", _SMALLEST[dtype], dtype, shape, group)
        cases[f"{name}-beta-below-one"] = _at_limit("beta1", _BELOW_ONE[dtype], dtype, (), 1 - group)
    for i, dtype in enumerate(INT_DTYPES):
        name, shape, group = str(dtype).replace("torch.", ""), ((), (1,))[i % 2], i % 2
        largest = _LARGEST_INT[dtype]
        cases[f"{name}-largest"] = _at_limit("weight_decay", largest, dtype, shape, group)
        cases[f"{name}-past-largest"] = _at_limit(
            "lr", 2.0**63 if dtype == torch.int64 else largest + 1, dtype, shape
        )
        cases[f"{name}-fraction"] = _at_limit("lr", 0.5, dtype, (), 1 - group)
    return cases


#: The cases SPEC 3.5.3 and 3.5.4 leave open (the second property): one tensor aliased by keys of
#: one group or by both groups, saved equal or different; leaf destinations that require grad.
def _open_limits() -> dict:
    shared = Destination(torch.float32, 1e-3, alias="shared")
    grad = Destination(torch.float32, 1e-3, requires_grad=True)
    plain = [dict(_PLAIN_GROUP), dict(_PLAIN_GROUP)]
    return {
        "alias-two-keys-equal": (
            [dict(_PLAIN_GROUP, weight_decay=1e-3), dict(_PLAIN_GROUP)],
            [dict(_FLOAT_DESTS, lr=shared, weight_decay=shared), _FLOAT_DESTS],
        ),
        "alias-two-keys-different": (
            plain,
            [dict(_FLOAT_DESTS, lr=shared, weight_decay=shared), _FLOAT_DESTS],
        ),
        "alias-two-groups-equal": (plain, [dict(_FLOAT_DESTS, eps=shared), dict(_FLOAT_DESTS, eps=shared)]),
        "alias-two-groups-different": (
            [dict(_PLAIN_GROUP), dict(_PLAIN_GROUP, beta1=0.8)],
            [dict(_FLOAT_DESTS, beta1=shared), dict(_FLOAT_DESTS, beta1=shared)],
        ),
        "requires-grad-every-key": (plain, [{k: grad for k in KEYS}, {k: grad for k in KEYS}]),
        "requires-grad-aliased": (
            plain,
            [
                dict(_FLOAT_DESTS, lr=Destination(torch.bfloat16, 1.0, (1,), True, "g")),
                dict(_FLOAT_DESTS, lr=Destination(torch.bfloat16, 1.0, (1,), True, "g")),
            ],
        ),
    }


LIMITS = _limits()
OPEN_LIMITS = _open_limits()
