"""Rule mutants of the step (each row names its rule id): for each rule the suite certifies from the
step's examples (:mod:`gefen_conformance.suite.step_rule_examples`), the reference with the one
source edit that breaks that rule (tests/source_mutants.py), as a kernel that gets that rule wrong
computes it. Each is ``wrong`` in the sense of tests/test_rule_mutants.py: it steps, differently.

A table row is ``rule: [(what, {module: (old, new)}), ...]``; every edit must apply exactly once
to the reference's current source.
"""

from __future__ import annotations

from .source_mutants import mutated_gefen

#: Section 1.4: a tensor learning rate in the step's formulas.
TENSOR_LR = {
    "1.4.3": [
        (
            "the tensor lr handed to the formulas as a tensor: the decay factor in the lr's dtype",
            {"optimizer": ('lr=scalar_lr(group["lr"]),', 'lr=group["lr"],')},
        )
    ],
}

#: Section 1.5: the period search.
PERIODS = {
    "1.5.1": [
        (
            "a parameter whose first gradient comes after the codebook's step takes a zero gradient's "
            "period (its shape's fallback), as a kernel that fixes every period with the codebook",
            {
                "optimizer": (
                    "period = self.choose_period(name, tuple(p.shape), grad)",
                    "period = self.choose_period(name, tuple(p.shape), torch.zeros_like(grad))",
                )
            },
        )
    ],
    "1.5.2#0": [
        (
            "an empty parameter gets state (period 1), routed as a one-element one",
            {
                "optimizer": (
                    "if grad.numel() == 0:\n                    continue",
                    'if grad.numel() == 0:\n                    self.state[p]["automatic_period"] = 1'
                    "\n                    continue",
                )
            },
        )
    ],
    "1.5.2#1": [
        (
            "a one-element parameter is searched like any other (the search has no candidate)",
            {"periods": ("if n == 1 or rules.forces_period_one(", "if rules.forces_period_one(")},
        )
    ],
    "1.5.2#2": [
        (
            "1-D parameters forced by force_2d_period_one (the flags swapped)",
            {"periods": ("self.force_1d_period_one and ndim == 1", "self.force_2d_period_one and ndim == 1")},
        )
    ],
    "1.5.2#3": [
        (
            "force_2d_period_one forces every parameter of two or more dimensions",
            {"periods": ("self.force_2d_period_one and ndim == 2", "self.force_2d_period_one and ndim >= 2")},
        )
    ],
    "1.5.2#4": [
        (
            "a period-one substring must be the whole name",
            {"periods": ("any(sub in lowered for", "any(sub == lowered for")},
        )
    ],
    "1.5.2#5": [
        (
            "no search: every period is the fallback's",
            {"periods": ("period = search_period(squared)\n", "period = 1\n")},
        )
    ],
    "1.5.3": [
        (
            "the gradient squared in its own dtype, then rounded to fp32",
            {"periods": ("local_grad.detach().float().square()", "local_grad.detach().square().float()")},
        )
    ],
    "1.5.5#1": [
        (
            "the first candidate scored 0 instead of 1e-12",
            {"periods": ("FIRST_CANDIDATE_SCORE = 1e-12", "FIRST_CANDIDATE_SCORE = 0.0")},
        ),
        (
            "each candidate scored by its E, not by its difference from the previous one",
            {"periods": ("else spread - previous", "else spread")},
        ),
    ],
    "1.5.5#2": [
        (
            "equal scores go to the larger period",
            {"periods": ("best = min(scored)[1]", "best = min(scored, key=lambda s: (s[0], -s[1]))[1]")},
        )
    ],
    "1.5.5#3": [
        (
            "a winner below 8 is kept",
            {"periods": ("return 1 if best < SMALLEST_SEARCHED_PERIOD else best", "return best")},
        )
    ],
    "1.5.6#1": [
        (
            "a parameter of fewer than 8 elements becomes one block",
            {
                "periods": (
                    "if n < SMALLEST_SEARCHED_PERIOD:\n        return 1",
                    "if n < SMALLEST_SEARCHED_PERIOD:\n        return n",
                )
            },
        )
    ],
    "1.5.6#3": [
        (
            "candidate B leaves n itself out",
            {"periods": ("proper_divisors(n) + [n] if d <= cap", "proper_divisors(n) if d <= cap")},
        )
    ],
    "1.5.6#4": [
        (
            "candidate A wins whenever there is one",
            {"periods": ("return max(options, default=1)", "return options[0] if options else 1")},
        )
    ],
    "1.5.7": [
        (
            "the cap exclusive: candidate B below 2048",
            {"periods": ("if d <= cap)", "if d < cap)")},
        )
    ],
    "1.5.9": [
        (
            "the candidates scored in fp32 (each block's variance computed in fp32)",
            {
                "periods": (
                    "blocks = squared.reshape(-1, period)",
                    "blocks = squared.astype(np.float32).reshape(-1, period)",
                )
            },
        )
    ],
}

#: Sections 1.6 and 1.7: the codebook and the nearest codeword.
CODEBOOK = {
    "1.6.2": [
        (
            "the codebook kept at bf16 precision",
            {
                "codebook": (
                    "np.asarray(codebook, dtype=np.float32).copy())",
                    "np.asarray(codebook, dtype=np.float32).copy()).bfloat16().float()",
                )
            },
        )
    ],
    "1.6.6": [
        (
            "a bin's value is its lower edge, not its centre",
            {"codebook": ("return 0.5 * (edges[:-1] + edges[1:])", "return edges[:-1]")},
        )
    ],
    "1.6.7#1": [
        (
            "the padding codebook filled up with +1, not the largest active centre",
            {"codebook_solver": ("cb[m:] = c[-1]", "cb[m:] = 1.0")},
        )
    ],
    "1.6.7#2": [
        (
            "-1 set before the active centres instead of over the smallest",
            {
                "codebook_solver": (
                    "cb[:m] = c\n    cb[m:] = c[-1]",
                    "cb[1 : m + 1] = c\n    cb[m + 1 :] = c[-1]",
                )
            },
        )
    ],
    "1.6.8": [
        (
            "an exact tie goes to the largest start (the last minimum kept)",
            {
                "codebook_solver": (
                    "leftmost = np.minimum.reduceat(np.where(candidate == best_each, s, n + m), first)",
                    "leftmost = np.maximum.reduceat(np.where(candidate == best_each, s, -1), first)",
                )
            },
        )
    ],
    "1.7.1#1": [
        (
            "the upper bound (entries <= v) instead of the lower bound",
            {
                "codewords": (
                    "torch.searchsorted(codebook, v.reshape(-1))",
                    "torch.searchsorted(codebook, v.reshape(-1), right=True)",
                )
            },
        )
    ],
    "1.7.1#2": [
        (
            "the right neighbour clamped to 254: +1 never chosen",
            {"codewords": ("right = upper.clamp(0, k - 1)", "right = upper.clamp(0, k - 2)")},
        )
    ],
    "1.7.1#3": [
        (
            "the distances rounded to bf16 before they are compared",
            {
                "codewords": (
                    "(v - codebook[left]).abs() <= (v - codebook[right]).abs()",
                    "(v - codebook[left]).abs().bfloat16() <= (v - codebook[right]).abs().bfloat16()",
                )
            },
        )
    ],
    "1.7.2": [
        (
            "the lowest index holding the chosen codeword (a value above a run takes the run's lowest)",
            {
                "codewords": (
                    "return torch.where(left_wins, left, right).to(torch.uint8)",
                    "return torch.searchsorted(codebook, codebook[torch.where(left_wins, left, right)])"
                    ".to(torch.uint8)",
                )
            },
        )
    ],
}

#: Section 1.8: the block second moment's step.
BLOCK_STEP = {
    "1.8.7#4": [
        (
            "the stepsize without the first moment's bias correction",
            {"steps": ("reciprocal(denom).mul_(1.0 / bc1)", "reciprocal(denom)")},
        )
    ],
}

#: Section 1.9: the factored second moment's step.
FACTORED_STEP: dict = {}

#: Section 1.10: one ``step()`` call.
CALLS: dict = {}

#: Section 1.13: torch semantics.
TORCH_SEMANTICS = {
    "1.13.9": [
        (
            "the gradient squared in float64",
            {"periods": ("local_grad.detach().float().square()", "local_grad.detach().double().square()")},
        )
    ],
}

STEP = {**TENSOR_LR, **PERIODS, **CODEBOOK, **BLOCK_STEP, **FACTORED_STEP, **CALLS, **TORCH_SEMANTICS}


def make_optimizers() -> list:
    """``[(rule, n, what, make_optimizer)]`` for every row of :data:`STEP` (``n``: its row)."""
    out = []
    for rule, rows in STEP.items():
        for n, (what, edits) in enumerate(rows):
            gefen = mutated_gefen(**edits)
            out.append((rule, n, what, lambda params, _g=gefen, **kw: _g(params, **kw)))
    return out
