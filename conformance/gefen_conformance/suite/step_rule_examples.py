"""The examples of the rules a step states (SPEC 1.4-1.10, 1.13): one row per rule example, each an
input-space case (SPEC 4.3.10) built so that the rule decides its outcome: an implementation wrong
in that rule alone steps differently from the reference beyond the profile's bounds.
:func:`gefen_conformance.suite.rule_checks.check_stepped` runs them; the cases are small (one to
three calls on a few hundred elements), since every row runs in every certification.

The tables go by the SPEC's sections: :data:`TENSOR_LR` (§1.4), :data:`PERIODS` (§1.5),
:data:`CODEBOOK` (§1.6, §1.7),
:data:`BLOCK_STEP` (§1.8), :data:`FACTORED_STEP` (§1.9), :data:`CALLS` (§1.10) and
:data:`TORCH_SEMANTICS` (§1.13); :data:`STEPPED` is all of them.
"""

from __future__ import annotations

from gefen_conformance.suite.rule_examples import Stepped
from gefen_conformance.workload.space import GroupCase, InputCase, ParamCase

P = ParamCase
G = GroupCase


def _case(*params, **kw) -> InputCase:
    return InputCase(params=tuple(params), **kw)


#: SPEC 1.4: a tensor learning rate in the step's formulas. A bf16 ``lr`` whose decay factor,
#: computed in bf16 (a kernel that hands the tensor to the formulas), rounds to 1.0.
TENSOR_LR = [
    Stepped(
        "1.4.3",
        "bf16-tensor-lr-decay",
        _case(P((64,)), groups=(G(lr=0.01, tensor_lr="bf16", weight_decay=0.1),), calls=2),
    ),
]

#: SPEC 1.5: the period a parameter's first step chooses.
PERIODS: list = []

#: SPEC 1.6 and 1.7: the codebook learned at the first step, and the nearest codeword.
CODEBOOK: list = []

#: SPEC 1.8: the block second moment's step.
BLOCK_STEP = [
    Stepped("1.8.7#4", "first-step-bias-correction", _case(P((64,)), calls=2)),
]

#: SPEC 1.9: the factored second moment's step.
FACTORED_STEP: list = []

#: SPEC 1.10: one ``step()`` call.
CALLS: list = []

#: SPEC 1.13: the torch semantics every formula is written in.
TORCH_SEMANTICS: list = []

STEPPED = TENSOR_LR + PERIODS + CODEBOOK + BLOCK_STEP + FACTORED_STEP + CALLS + TORCH_SEMANTICS
