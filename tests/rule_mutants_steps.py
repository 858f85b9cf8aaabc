"""Rule mutants of the step (SPEC 1.4-1.10, 1.13): for each rule the suite certifies from the
step's examples (:mod:`gefen_conformance.suite.step_rule_examples`), the reference with the one
source edit that breaks that rule (tests/source_mutants.py), as a kernel that gets that rule wrong
computes it. Each is ``wrong`` in the sense of tests/test_rule_mutants.py: it steps, differently.

A table row is ``rule: [(what, {module: (old, new)}), ...]``; every edit must apply exactly once
to the reference's current source.
"""

from __future__ import annotations

from .source_mutants import mutated_gefen

#: SPEC 1.4: a tensor learning rate in the step's formulas.
TENSOR_LR = {
    "1.4.3": [
        (
            "the tensor lr handed to the formulas as a tensor: the decay factor in the lr's dtype",
            {"optimizer": ('lr=scalar_lr(group["lr"]),', 'lr=group["lr"],')},
        )
    ],
}

#: SPEC 1.5: the period search.
PERIODS: dict = {}

#: SPEC 1.6 and 1.7: the codebook and the nearest codeword.
CODEBOOK: dict = {}

#: SPEC 1.8: the block second moment's step.
BLOCK_STEP = {
    "1.8.7#4": [
        (
            "the stepsize without the first moment's bias correction",
            {"steps": ("reciprocal(denom).mul_(1.0 / bc1)", "reciprocal(denom)")},
        )
    ],
}

#: SPEC 1.9: the factored second moment's step.
FACTORED_STEP: dict = {}

#: SPEC 1.10: one ``step()`` call.
CALLS: dict = {}

#: SPEC 1.13: torch semantics.
TORCH_SEMANTICS: dict = {}

STEP = {**TENSOR_LR, **PERIODS, **CODEBOOK, **BLOCK_STEP, **FACTORED_STEP, **CALLS, **TORCH_SEMANTICS}


def make_optimizers() -> list:
    """``[(rule, n, what, make_optimizer)]`` for every row of :data:`STEP` (``n``: its row)."""
    out = []
    for rule, rows in STEP.items():
        for n, (what, edits) in enumerate(rows):
            gefen = mutated_gefen(**edits)
            out.append((rule, n, what, lambda params, _g=gefen, **kw: _g(params, **kw)))
    return out
