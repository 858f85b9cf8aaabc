"""The strategies of the staging properties (SPEC 3.5, 4.3.9): saved hyperparameters, mostly
ordinary with one draw in eight at an edge, and live destinations (numbers and one-element tensors
of every dtype; with ``open_cases``, the cases gefen-x leaves open). The explicit examples are in
:mod:`gefen_conformance.suite.staging_examples`.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from gefen_conformance.suite.staging import FLOAT_DTYPES, INT_DTYPES, KEYS, Destination


def ulps_below_one(n: int) -> float:
    x = 1.0
    for _ in range(n):
        x = math.nextafter(x, 0.0)
    return x


ordinary = st.floats(1e-6, 1.0)
tiny = st.sampled_from([5e-324, 1e-310, 1e-45, 1.4e-45, 1e-40, 6e-8, 5.96e-8, 1e-30, 1e-8])
huge = st.sampled_from([65504.0, 65520.0, 70000.0, 3.4e38, 3.5e38, 1e39, 1e300])
integral = st.sampled_from(
    [0.0, 1.0, 2.0, 3.0, 127.0, 128.0, 255.0, 256.0, 32767.0, 32768.0, 2.0**31, 2.0**63]
)
fractional = st.sampled_from([0.5, 1.5, 2.25, 1e-3, 0.1, 3e-4])
near_one = st.integers(1, 12).map(ulps_below_one) | st.sampled_from(
    [0.9999, 0.99951, 0.9995, 0.999, 0.996, 0.998]
)


def _edge_value(key):
    if key in ("beta1", "beta2"):
        return near_one | tiny | st.just(0.0)
    if key == "eps":
        return tiny | huge | integral.filter(lambda x: x > 0)
    return tiny | huge | integral | fractional


def _plain_value(key):
    if key in ("beta1", "beta2"):
        return st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99, 0.999]) | st.floats(0.0, 0.99)
    if key == "eps":
        return st.sampled_from([1e-8, 1e-6, 1e-3]) | st.floats(1e-6, 1e-2)
    return ordinary | st.just(0.0)


# built once: a strategy built inside a draw is built (and validated) again for every example
_EDGE = {key: _edge_value(key) for key in KEYS}
_PLAIN = {key: _plain_value(key) for key in KEYS}


def saved_value(key):
    """Mostly ordinary values, one draw in eight at an edge, so both verdicts are common."""
    edge, plain = _EDGE[key], _PLAIN[key]
    return st.integers(0, 7).flatmap(lambda i: edge if i == 0 else plain)


saved_group = st.fixed_dictionaries({k: saved_value(k) for k in KEYS})


_KIND = st.sampled_from(["float"] * 3 + ["float-tensor"] * 4 + ["int-tensor"])
_DTYPE = {"float-tensor": st.sampled_from(FLOAT_DTYPES), "int-tensor": st.sampled_from(INT_DTYPES)}
_SHAPE = st.sampled_from([(), (1,)])


@st.composite
def destination(draw, key, open_cases: bool):
    """A live entry; ``open_cases`` adds the two cases gefen-x leaves open (SPEC 3.5.3, 3.5.4):
    destinations that require grad, and one tensor aliased by several keys or groups."""
    kind = draw(_KIND)
    default = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}[key]
    if kind == "float":
        return Destination(None, default)
    dtype = draw(_DTYPE[kind])
    value = default if dtype.is_floating_point else 0.0
    shape = draw(_SHAPE)
    requires_grad = open_cases and dtype.is_floating_point and draw(st.booleans())
    alias = draw(st.sampled_from([None, None, f"{dtype}-{shape}-{requires_grad}"])) if open_cases else None
    return Destination(dtype, value, shape, requires_grad, alias)


def destination_groups(open_cases: bool):
    return st.lists(
        st.fixed_dictionaries({k: destination(k, open_cases) for k in KEYS}), min_size=2, max_size=2
    )
