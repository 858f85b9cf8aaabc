"""The optimizer over its input space (SPEC 4.3.10), judged by the pinned-step oracle (SPEC 5.6).

One example is one :class:`gefen_conformance.workload.space.InputCase`: parameters of any shape,
dtype and memory layout in any group structure, a synthesized native state at any step counter
(or a fresh one), a few ``step()`` calls with hyperparameter schedules between them, made by
plain calls, through a closure or under the GradScaler protocol. The reference's native state
dict of the case is loaded into the implementation and into the reference, both are driven
through the calls, and each call is compared:

* exact in both profiles (SPEC 5.6.11): counters, periods, names, hyperparameters, key sets,
  dtypes and shapes of the state, the loaded (frozen) codebook and the global step, against the
  reference's same call; a closure's loss returned; a parameter without a gradient, and every
  parameter and state entry under a ``found_inf`` call, bit for bit unchanged (SPEC 1.10.3);
* under ``cpu-bit-exact`` on CPU: every parameter and state tensor bitwise against the reference,
  except fp64 parameters, which every profile judges by tolerance (SPEC 0.4.2);
* otherwise: each call as a pinned step (SPEC 5.6.1-5.6.9) from the implementation's own state
  and parameters before it, against float64 arithmetic of SPEC 1.8 / 1.9 with the hyperparameters
  the reference's groups held at that call. Nothing accumulates, so a counter of 2^31 is judged
  as sharply as a counter of 1, and a free-running divergence of quantized momentum never enters.

``test_inputs_match_reference`` draws plain calls, ``test_protocols_match_reference`` closures
and GradScaler calls with frozen parameters anywhere. Under ``gefen-certify`` both run their
explicit examples (every boundary SPEC 4.3.10 names: sizes at the tile limits 2048, 16384, 65536
and 2^20, counters 1, 255, 256, 1000 and beyond, each layout, dtype mix, group shape, schedule,
gradient pattern and protocol) and then a share of the profile's derandomized examples (small
cases only; :data:`EXAMPLE_SHARE`); ``gefen-fuzz`` draws the same share of its random examples.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from gefen_conformance.implementations.contract import FACTORED_V, NATIVE_STATE_DICT
from gefen_conformance.suite.properties import share_of_profile, with_examples
from gefen_conformance.suite.space_checks import InputSpaceCase
from gefen_conformance.suite.space_examples import (
    BOUNDARIES,
    GROUPS_ADDED,
    LIFECYCLE,
    PROTOCOL_BOUNDARIES,
)
from gefen_conformance.suite.space_strategies import input_cases, lifecycle_cases
from gefen_conformance.workload.space import InputCase

#: Each property runs this share of the hypothesis profile's examples (``gefen-certify``: 300 -> 25;
#: ``gefen-fuzz``: 5000 -> 416), after its explicit examples: one example drives two optimizers
#: through up to three calls and recomputes each call in float64, about a hundred times the work of
#: a staging example (SPEC 4.3.10).
EXAMPLE_SHARE = 12
#: The lifecycle properties run this share (``gefen-certify``: 300 -> 12): their explicit examples
#: hold the large counts, the draws cover the combinations.
LIFECYCLE_SHARE = 25


def _check(impl, judge, case: InputCase) -> None:
    """The case (on the block path where the implementation has no factored second moment) run by
    the reference and by ``impl``, every call compared; a failing case is the reproducer."""
    if case.factored and not impl.has(FACTORED_V):
        case = case.without_factored()
    drawn = InputSpaceCase(case)
    judge.assert_comparisons(drawn.comparisons(impl, bitwise=judge.bitwise), case=drawn)


@pytest.mark.gefen_clause(
    "4.3.10", "1.4", "1.5", "1.6", "1.7", "1.8", "1.9", "1.10.7", "1.13.8", "5.6", "5.6.13"
)
@pytest.mark.gefen_clause("1.6.4", "1.7.3", "1.9.3#5")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@share_of_profile(EXAMPLE_SHARE)
@with_examples(BOUNDARIES, "case")
@given(case=input_cases())
def test_inputs_match_reference(gefen_impl, gefen_judge, case):
    """Shapes and routing, layouts, dtype mixes, group structures, schedules, step counters and
    gradient patterns, by plain ``step()`` calls."""
    _check(gefen_impl, gefen_judge, case)


@pytest.mark.gefen_clause(
    "4.3.10", "1.10.1", "1.10.3", "1.10.4", "1.10.6", "1.10.11", "1.10.12", "1.2.6", "5.6", "5.6.13"
)
@pytest.mark.gefen_clause("1.10.1#5")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@share_of_profile(EXAMPLE_SHARE)
@with_examples(PROTOCOL_BOUNDARIES, "case")
@given(case=input_cases(protocols=("closure", "grad-scale", "found-inf"), frozen_share=3))
def test_protocols_match_reference(gefen_impl, gefen_judge, case):
    """``step(closure)`` with ``zero_grad(set_to_none=True)`` inside the closure, the GradScaler
    protocol (``grad_scale`` unscales; ``found_inf`` changes nothing), frozen parameters anywhere."""
    _check(gefen_impl, gefen_judge, case)


@pytest.mark.gefen_clause(
    "4.3.12", "4.3.10", "1.2", "1.4", "1.5", "1.10.7", "5.6.13", "1.5.4", "1.5.6#2", "1.6.3", "1.8.3"
)
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@share_of_profile(LIFECYCLE_SHARE)
@with_examples(LIFECYCLE, "case")
@given(case=lifecycle_cases())
def test_lifecycle_matches_reference(gefen_impl, gefen_judge, case):
    """Hundreds of parameters in one step, gradients taking turns and bucketed in reverse, a group
    added and storage replaced between steps, hyperparameters at their edges, the period search's
    own inputs and periods above its fallback cap."""
    _check(gefen_impl, gefen_judge, case)


@pytest.mark.gefen_clause("4.3.12", "1.2.7", "1.10.7", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@share_of_profile(LIFECYCLE_SHARE)
@with_examples(GROUPS_ADDED, "case")
@given(case=lifecycle_cases(add_group=True))
def test_group_added_after_steps_matches_reference(gefen_impl, gefen_judge, case):
    """``add_param_group`` between steps: the new group's parameters start fresh beside stepped
    ones and step with the new group's hyperparameters."""
    _check(gefen_impl, gefen_judge, case)
