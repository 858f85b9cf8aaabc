"""The examples of the rules a step states (each row names its rule id): one row per rule example,
each an input-space case (SPEC 4.3.10) built so that the rule decides its outcome: an
implementation wrong in that rule alone steps differently from the reference beyond the profile's
bounds.
:func:`gefen_conformance.suite.rule_checks.check_stepped` runs them; the cases are small (one to
three calls on a few hundred elements), since every row runs in every certification.

The tables go by the SPEC's sections of Part 1: :data:`TENSOR_LR` (section 4), :data:`PERIODS`
(5), :data:`CODEBOOK` (6 and 7), :data:`BLOCK_STEP` (8), :data:`FACTORED_STEP` (9), :data:`CALLS`
(10) and :data:`TORCH_SEMANTICS` (13); :data:`STEPPED` is all of them. :data:`REFUSED_CALLS` holds
the calls refused before anything changes (the first items of a step's order, its preflight and
its fail-before-mutation rule), each a :class:`~gefen_conformance.suite.rule_examples.StepRefused`
that :func:`gefen_conformance.suite.rule_checks.check_step_refused` runs.
"""

from __future__ import annotations

from gefen_conformance.suite.rule_examples import (
    Stepped,
    StepRefused,
    complex_grad,
    sparse_grad,
    transposed_grad,
    valid,
)
from gefen_conformance.workload.space import GroupCase, InputCase, ParamCase

P = ParamCase
G = GroupCase


def _case(*params, **kw) -> InputCase:
    return InputCase(params=tuple(params), **kw)


#: A parameter whose rows alternate in scale: the search finds the row (10), where the fallback
#: gives 240 (SPEC 1.5.5, 1.5.6).
_ROWS = P((24, 10), gradient="row-scaled")
#: Every square 1 (random signs): the search finds nothing and the fallback decides (SPEC 1.5.6).
_SIGNS = "signs"
#: A gradient whose squares are one value in fp32 and two in float64 (SPEC 1.5.3, 1.13.9).
_BELOW_FP32 = _case(P((24, 10), dtype="fp64", gradient="below-fp32"))
#: Squares of period 4 whose scores tie at exactly 0 from 8 on in float64, and not in fp32 (SPEC
#: 1.5.5, 1.5.9).
_FOUR_CYCLE = _case(P((128,), gradient="four-cycle"))
#: Rows of SPEC 1.5.7's table, each searched to 1 (equal squares): a cap of 2048 (inclusive), a
#: divisor below it, ``n`` itself (prime), fewer than 8 elements, ``shape[-1]`` below ``n``.
_FALLBACK_TABLE = _case(*(P(shape, gradient=_SIGNS) for shape in ((4096,), (3000,), (37,), (7,), (16, 8))))

#: Section 1.4: a tensor learning rate in the step's formulas. A bf16 ``lr`` whose decay factor,
#: computed in bf16 (a kernel that hands the tensor to the formulas), rounds to 1.0.
TENSOR_LR = [
    Stepped(
        "1.4.3",
        "bf16-tensor-lr-decay",
        _case(P((64,)), groups=(G(lr=0.01, tensor_lr="bf16", weight_decay=0.1),), calls=2),
    ),
    # A float lr of many significant bits and ``lr * weight_decay`` just below 1, so the decay factor
    # is about 1e-6: rounded to fp32 before the product (a kernel that keeps every lr in an fp32
    # device scalar), the factor moves by 1.7%, and a parameter with a zero gradient (no update,
    # only the decay) shows it under every profile.
    Stepped(
        "1.4.4",
        "float-lr-decay",
        _case(
            P((64,), gradient="zero"),
            P((64,)),
            groups=(G(lr=0.7, weight_decay=(1 - 1e-6) / 0.7),),
            calls=2,
        ),
    ),
]

#: Section 1.5: the period a parameter's first step chooses. Periods are exact in every profile.
PERIODS = [
    Stepped(
        "1.5.1",
        "first-gradient-after-the-codebook",
        _case(P((8, 8)), P((24, 10), gradient="late"), calls=2, codebook="learned"),
    ),
    Stepped("1.5.2#0", "empty-parameter-skipped", _case(P((0, 4)), P((8, 8)), codebook="learned")),
    Stepped("1.5.2#1", "one-element", _case(P((1,)), P((1, 1)), P((8, 8)))),
    Stepped("1.5.2#2", "force-1d", _case(P((64,)), _ROWS, options=("force_1d_period_one",))),
    Stepped(
        "1.5.2#3",
        "force-2d",
        _case(_ROWS, P((4, 6, 10), gradient="row-scaled"), options=("force_2d_period_one",)),
    ),
    Stepped("1.5.2#4", "name-substring", _case(_ROWS, _ROWS, options=("period_one_substrings",))),
    Stepped("1.5.2#5", "searched", _case(_ROWS)),
    Stepped("1.5.3", "squares-rounded-to-fp32", _BELOW_FP32),
    Stepped("1.5.5#1", "differenced-scores", _FOUR_CYCLE),
    Stepped("1.5.5#2", "tie-to-the-smaller-period", _FOUR_CYCLE),
    Stepped("1.5.5#3", "winner-below-8", _case(P((24, 5), gradient="row-scaled"))),
    Stepped("1.5.6#1", "fewer-than-8-elements", _case(P((7,)), P((2, 3)))),
    Stepped("1.5.6#3", "n-itself-a-candidate", _case(P((37,), gradient=_SIGNS), P((64,), gradient=_SIGNS))),
    Stepped("1.5.6#4", "larger-candidate", _case(P((16, 8), gradient=_SIGNS))),
    Stepped("1.5.7", "fallback-worked-examples", _FALLBACK_TABLE),
    Stepped("1.5.9", "float64-scores", _FOUR_CYCLE),
]

#: The padding case of the codebook (fewer than 256 active bins), every block normalizing exactly:
#: the learned codebook is compared bitwise in every profile (SPEC 5.6.7).
_PADDED = _case(P((64,), gradient="powers-of-two"), codebook="learned")
#: The all-zero padding codebook learned at the first call, then SPEC 1.7.2's values with beta1 0
#: (the momentum is the gradient, every normalized value exact, SPEC 5.6.6).
_TABLE = _case(
    P((64,), gradient="codeword-table"), groups=(G(betas=(0.0, 0.999)),), calls=2, codebook="learned"
)

#: Sections 1.6 and 1.7: the codebook learned at the first step, and the nearest codeword.
CODEBOOK = [
    Stepped("1.6.2", "fp32-codewords", _PADDED),
    Stepped("1.6.6", "bin-centres", _PADDED),
    Stepped("1.6.7#1", "padded-with-the-largest-centre", _PADDED),
    Stepped("1.6.7#2", "smallest-centre-overwritten", _PADDED),
    Stepped(
        "1.6.8", "tie-to-the-smallest-start", _case(P((510,), gradient="bin-ladder"), codebook="learned")
    ),
    Stepped("1.7.1#1", "lower-bound", _TABLE),
    Stepped("1.7.1#2", "neighbours-clamped", _TABLE),
    Stepped("1.7.1#3", "fp32-distances", _TABLE),
    Stepped("1.7.2", "nearest-codeword-worked-examples", _TABLE),
]

#: Section 1.8: the block second moment's step.
BLOCK_STEP = [
    Stepped("1.8.1", "fresh-state", _case(P((64,)))),
    Stepped("1.8.2", "legacy-without-vmean-step", _case(P((64,), period=16), counter=4, state_form="legacy")),
    Stepped(
        "1.8.2",
        "factored-state-on-block-path",
        _case(P((8, 16), period=16), counter=4, state_form="other-mode"),
    ),
    Stepped("1.8.4", "counters", _case(P((64,), period=16), counter=3, moment_counter=2)),
    Stepped("1.8.7#1", "square-root", _case(P((64,)), calls=2)),
    Stepped("1.8.7#2", "second-moment-bias-correction", _case(P((64,)), calls=2)),
    Stepped("1.8.7#4", "first-step-bias-correction", _case(P((64,)), calls=2)),
    Stepped("1.8.8#1", "dequantize", _case(P((64,), period=16), counter=3)),
    Stepped("1.8.8#2", "lerp", _case(P((64,), period=16), counter=3)),
    Stepped("1.8.8#3", "magnitude", _case(P((64,)))),
    Stepped("1.8.8#4", "zero-momentum-normalizes-to-zero", _case(P((64,), gradient="zero"))),
    Stepped("1.8.8#5", "requantize", _case(P((64,), period=16), counter=3)),
    Stepped("1.8.8#6", "quantized-momentum", _case(P((64,), period=16), counter=3)),
    Stepped("1.8.8#7", "update", _case(P((64,), period=16), counter=3)),
    Stepped("1.8.10", "default-constants", _case(P((4,)), P((256,)))),
    Stepped("1.8.11", "state-types", _case(P((64,), dtype="bf16"))),
    Stepped("1.8.12", "no-scratch-in-state-dict", _case(P((64,)))),
]

#: Section 1.9: the factored second moment's step.
FACTORED_STEP = [
    Stepped("1.9.2", "factored-fresh-state", _case(P((16, 24)), factored=True)),
    Stepped(
        "1.9.2",
        "block-state-on-factored-path",
        _case(P((8, 16), period=16), factored=True, counter=4, state_form="other-mode"),
    ),
    Stepped(
        "1.9.3#1",
        "factored-counters",
        _case(P((16, 24), period=24), factored=True, counter=3, moment_counter=2),
    ),
    Stepped("1.9.3#2", "factored-bias-corrections", _case(P((16, 24)), factored=True, calls=2)),
    Stepped("1.9.3#3", "squares-in-fp32", _case(P((16, 24), dtype="bf16"), factored=True)),
    Stepped("1.9.3#4", "factored-second-moments", _case(P((16, 24), period=24), factored=True, counter=3)),
    Stepped("1.9.3#6", "factored-denominator", _case(P((16, 24)), factored=True, calls=2)),
    Stepped("1.9.3#7", "factored-stepsize", _case(P((16, 24)), factored=True, calls=2)),
    Stepped("1.9.3#8", "momentum-in-logical-order", _case(P((16, 24)), factored=True)),
    Stepped(
        "1.9.3#9", "factored-weight-decay", _case(P((16, 24)), groups=(G(weight_decay=0.1),), factored=True)
    ),
    Stepped("1.9.3#10", "factored-update", _case(P((16, 24), period=24), factored=True, counter=3)),
    Stepped("1.9.4", "bias-correction-under-the-root", _case(P((4,)), P((16, 24)), factored=True, calls=2)),
    Stepped(
        "1.9.5",
        "re-warmed-second-moment",
        _case(P((16, 24), period=24), factored=True, counter=6, moment_counter=2),
    ),
]

#: Section 1.10: one ``step()`` call.
CALLS = [
    Stepped(
        "1.10.1#3",
        "skipped-first-call-learns-nothing",
        _case(P((64,)), calls=2, protocol="found-inf", codebook="learned"),
    ),
    Stepped(
        "1.10.1#4",
        "codebook-from-the-closures-gradients",
        _case(P((64,)), protocol="closure", codebook="learned"),
    ),
    Stepped("1.10.1#6", "global-step", _case(P((64,)))),
    Stepped(
        "1.10.7",
        "late-parameter-uses-frozen-codebook",
        _case(P((64,)), P((48,), gradient="late"), calls=2, codebook="learned"),
    ),
    Stepped(
        "1.10.12",
        "found-inf-changes-nothing",
        _case(P((64,), period=16), counter=3, calls=2, protocol="found-inf"),
    ),
    Stepped("1.10.12", "grad-scale-unscales", _case(P((64,)), calls=2, protocol="grad-scale")),
]

#: SPEC 1.10.1 items 2-4, 1.10.2 and 1.10.5: calls refused before anything changes, each invalid
#: in the gradient of ``narrow`` (24 x 3), which comes after most parameters in registration
#: order (an implementation that checks as it steps has updated them when it finds it). A
#: gradient on another device than its parameter (SPEC 1.10.2) has no example: torch refuses to
#: assign one, or to replace a gradient's data by one.
REFUSED_CALLS = [
    StepRefused(
        "1.10.1#2",
        "preflight-before-found-inf",
        transposed_grad("narrow"),
        words="shape",
        attributes=(("found_inf", 1.0), ("grad_scale", 1024.0)),
    ),
    StepRefused("1.10.2", "sparse-gradient", sparse_grad("narrow"), words="sparse"),
    StepRefused("1.10.2", "complex-gradient", complex_grad("narrow"), words="complex"),
    StepRefused("1.10.2", "gradient-of-another-shape", transposed_grad("narrow"), words="shape"),
    StepRefused("1.10.5", "preflight-error", transposed_grad("narrow"), words="shape"),
    StepRefused(
        "1.10.5", "preflight-error-at-first-step", transposed_grad("narrow"), words="shape", fresh=True
    ),
    StepRefused("1.10.5", "invalid-grad-scale", valid, attributes=(("found_inf", 0.0), ("grad_scale", 0.0))),
    StepRefused(
        "1.10.5", "found-inf-of-two-elements", valid, attributes=(("found_inf", [0.0, 0.0]),), fresh=True
    ),
]

#: Section 1.13: the torch semantics every formula is written in. Most of these rules bind the
#: torch-exact profile only (a kernel may round otherwise, SPEC 5.6.1): their cases put the judged
#: parameter second, at ``1e-3`` scale (:func:`gefen_conformance.workload.space.initial`), so that
#: one ulp of its update shows in its value (as in ``1.8.10`` and ``1.9.4``).
TORCH_SEMANTICS = [
    Stepped("1.13.1", "torch-square-root", _case(P((4,)), P((16, 24)), factored=True)),
    Stepped("1.13.2", "torch-row-sums", _case(P((4,)), P((16, 24)), factored=True)),
    Stepped(
        "1.13.3",
        "fused-second-moment-update",
        _case(P((512,), period=16), groups=(G(betas=(0.9, 0.6)),), counter=3),
    ),
    Stepped("1.13.4", "division-by-a-0-dim-tensor", _case(P((4,)), P((16, 24)), factored=True)),
    Stepped(
        "1.13.5",
        "codewords-in-the-gradient-dtype",
        _case(P((4,)), P((64,), dtype="bf16", period=16), counter=3),
    ),
    Stepped("1.13.6", "powers-in-double", _case(P((4,)), P((64,), period=16), counter=3)),
    Stepped(
        "1.13.7",
        "scalar-operand-in-fp32",
        _case(P((64,), dtype="bf16"), groups=(G(lr=1e-4, weight_decay=30.0),)),
    ),
    Stepped("1.13.9", "period-input-squared-in-fp32", _BELOW_FP32),
]

STEPPED = TENSOR_LR + PERIODS + CODEBOOK + BLOCK_STEP + FACTORED_STEP + CALLS + TORCH_SEMANTICS
