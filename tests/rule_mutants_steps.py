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

TENSOR_LR["1.4.4"] = [
    (
        "a float lr rounded to fp32 before the formulas (every lr kept in an fp32 device scalar)",
        {
            "optimizer": (
                'lr=scalar_lr(group["lr"]),',
                'lr=float(torch.tensor(group["lr"], dtype=torch.float32))'
                ' if isinstance(group["lr"], float) else scalar_lr(group["lr"]),',
            )
        },
    )
]

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
    "1.8.1": [
        (
            "the block magnitudes start at one (a quantizer's identity scale), not zero",
            {
                "steps": (
                    'state["m_magnitude"] = torch.zeros((blocks, 1)',
                    'state["m_magnitude"] = torch.ones((blocks, 1)',
                )
            },
        )
    ],
    "1.8.2": [
        (
            "a legacy state's missing vmean_step taken as 0 (a fresh moment), not as step",
            {"optimizer": ('state["vmean_step"] = state["step"]', 'state["vmean_step"] = 0')},
        ),
        (
            "a missing vmean created with the legacy repair's counter (step), not 0",
            {
                "optimizer": (
                    'elif "vmean" not in state:\n            new_block_second_moment(state)',
                    'elif "vmean" not in state:\n            new_block_second_moment(state)\n'
                    '            state["vmean_step"] = state["step"]',
                )
            },
        ),
    ],
    "1.8.4": [
        (
            "the second moment's counter not advanced",
            {"steps": ('    state["vmean_step"] += 1\n', "")},
        )
    ],
    "1.8.7#1": [
        (
            "the stepsize from the second moment itself, without its square root",
            {"steps": ('torch.sqrt(state["vmean"])', 'state["vmean"].clone()')},
        )
    ],
    "1.8.7#2": [
        (
            "the square root divided by bc2 (the factored form), not by sqrt(bc2)",
            {"steps": (".div_(math.sqrt(bc2))", ".div_(bc2)")},
        )
    ],
    "1.8.7#4": [
        (
            "the stepsize without the first moment's bias correction",
            {"steps": ("reciprocal(denom).mul_(1.0 / bc1)", "reciprocal(denom)")},
        )
    ],
    "1.8.8#1": [
        (
            "the previous momentum decoded without its block magnitude",
            {
                "steps": (
                    'grad_blocks.dtype) * state["m_magnitude"]\n',
                    "grad_blocks.dtype)\n",
                )
            },
        )
    ],
    "1.8.8#2": [
        (
            "the lerp weighted by beta1 instead of 1 - beta1",
            {"steps": ("grad_blocks.to(current.dtype), 1 - beta1)", "grad_blocks.to(current.dtype), beta1)")},
        )
    ],
    "1.8.8#3": [
        (
            "the block magnitude as the largest signed value, not the largest absolute one",
            {"steps": ("magnitude.copy_(updated.abs().reshape", "magnitude.copy_(updated.reshape")},
        )
    ],
    "1.8.8#4": [
        (
            "a block whose magnitude is zero normalized without the guard (0/0: NaN)",
            {"steps": ("    updated.masked_fill_(~(magnitude > 0), 0.0)\n", "")},
        )
    ],
    "1.8.8#5": [
        (
            "the new indices not written back (the previous ones kept)",
            {"steps": ('    state["m_codebook"].copy_(indices)\n', "")},
        )
    ],
    "1.8.8#6": [
        (
            "the update driven by the momentum before quantization",
            {
                "steps": (
                    "return dequantize(codebook, indices, grad_blocks.dtype) * magnitude",
                    "return updated.mul_(magnitude)",
                )
            },
        )
    ],
    "1.8.8#7": [
        (
            "the update added to the parameter instead of subtracted",
            {"steps": ("add_(update.reshape(-1), alpha=-1)", "add_(update.reshape(-1), alpha=1)")},
        )
    ],
    "1.8.10": [
        (
            "the lerp weight 1 - beta1 formed from fp32(beta1)",
            {
                "steps": (
                    "grad_blocks.to(current.dtype), 1 - beta1)",
                    "grad_blocks.to(current.dtype), 1 - float(torch.tensor(beta1)))",
                )
            },
        )
    ],
    "1.8.12": [
        (
            "the per-block stepsize kept in the parameter's state (a scratch buffer)",
            {
                "steps": (
                    "    stepsize = torch.reciprocal(denom)",
                    '    stepsize = state["_stepsize"] = torch.reciprocal(denom)',
                )
            },
        )
    ],
    "1.8.11": [
        (
            "the step counter a float tensor (as torch's Adam keeps it), not a Python int",
            {"steps": ('state["step"] = 0\n', 'state["step"] = torch.tensor(0.0)\n')},
        )
    ],
}

#: Section 1.9: the factored second moment's step.
FACTORED_STEP = {
    "1.9.2": [
        (
            "a block second moment created beside the factored one",
            {
                "optimizer": (
                    "new_factored_second_moment(state, tuple(p.shape), grad.device)\n",
                    "new_factored_second_moment(state, tuple(p.shape), grad.device)\n"
                    "                new_block_second_moment(state)\n",
                )
            },
        ),
        (
            "a missing factored moment created with the counter of the block one",
            {
                "optimizer": (
                    "new_factored_second_moment(state, tuple(p.shape), grad.device)\n",
                    "new_factored_second_moment(state, tuple(p.shape), grad.device)\n"
                    '                state["factored_step"] = state.get("vmean_step", 0)\n',
                )
            },
        ),
    ],
    "1.9.3#1": [
        (
            "the factored counter not advanced",
            {"steps": ('    state["factored_step"] += 1\n', "")},
        )
    ],
    "1.9.3#2": [
        (
            "bc2 from beta1 (a copy of bc1's line)",
            {
                "steps": (
                    'bc2 = 1 - hyper.beta2 ** state["factored_step"]',
                    'bc2 = 1 - hyper.beta1 ** state["factored_step"]',
                )
            },
        )
    ],
    "1.9.3#3": [
        (
            "the squares taken in the gradient's dtype",
            {
                "steps": (
                    "squares = chunk.square() if chunk.dtype == torch.float32 else chunk.float().square_()",
                    "squares = chunk.square().float()",
                )
            },
        )
    ],
    "1.9.3#4": [
        (
            "the column moment's new mean square added without its weight 1 - beta2",
            {
                "steps": (
                    'state["v_col"].mul_(hyper.beta2).add_(col_ms, alpha=1 - hyper.beta2)',
                    'state["v_col"].mul_(hyper.beta2).add_(col_ms)',
                )
            },
        )
    ],
    "1.9.3#6": [
        (
            "the rank-one estimate divided by sqrt(bc2) (the block form), not by bc2",
            {"steps": ("v_hat.div_(bc2).sqrt_()", "v_hat.div_(math.sqrt(bc2)).sqrt_()")},
        )
    ],
    "1.9.3#7": [
        (
            "the factored stepsize without the first moment's bias correction",
            {"steps": ("denom.reciprocal_().mul_(1.0 / bc1)", "denom.reciprocal_()")},
        )
    ],
    "1.9.3#8": [
        (
            "the momentum's blocks taken in column-major order",
            {
                "steps": (
                    "codebook, grad.reshape(-1).view(-1, period)",
                    "codebook, grad.t().reshape(-1).view(-1, period)",
                )
            },
        )
    ],
    "1.9.3#9": [
        (
            "the factored step without weight decay",
            {
                "steps": (
                    "    if hyper.weight_decay > 0.0:\n"
                    "        param.mul_(1 - hyper.lr * hyper.weight_decay)\n"
                    "    # SPEC 1.9.3 step 10",
                    "    # SPEC 1.9.3 step 10",
                )
            },
        )
    ],
    "1.9.3#10": [
        (
            "the factored update added instead of subtracted",
            {"steps": ("param.add_(-update)", "param.add_(update)")},
        )
    ],
    "1.9.4": [
        (
            "the factored denominator as sqrt(V) / sqrt(bc2), the block path's form",
            {"steps": ("v_hat.div_(bc2).sqrt_()", "v_hat.sqrt_().div_(math.sqrt(bc2))")},
        )
    ],
    "1.9.5": [
        (
            "the factored bc2 from the step counter, not the moment's own",
            {
                "steps": (
                    'bc2 = 1 - hyper.beta2 ** state["factored_step"]',
                    'bc2 = 1 - hyper.beta2 ** state["step"]',
                )
            },
        )
    ],
}

#: Section 1.10: one ``step()`` call.
CALLS = {
    "1.10.1#3": [
        (
            "the codebook learned before the GradScaler protocol (a skipped first call learns it)",
            {
                "optimizer": (
                    "        if not self._apply_grad_scaler():\n            return loss\n"
                    "        if self.codebook is None:\n            self._learn_codebook()\n",
                    "        if self.codebook is None:\n            self._learn_codebook()\n"
                    "        if not self._apply_grad_scaler():\n            return loss\n",
                )
            },
        )
    ],
    "1.10.1#4": [
        (
            "the codebook learned as the call begins, from the gradients held before the closure",
            {
                "optimizer": (
                    "        loss = None\n",
                    "        loss = None\n"
                    "        if self.codebook is None:\n            self._learn_codebook()\n",
                )
            },
        )
    ],
    "1.10.1#6": [
        (
            "the global step not advanced",
            {"optimizer": ("        self.global_step += 1\n        return loss", "        return loss")},
        )
    ],
    "1.10.7": [
        (
            "the codebook learned again when a parameter gets its first gradient",
            {
                "optimizer": (
                    "        if self.codebook is None:\n            self._learn_codebook()\n",
                    "        if self.codebook is None or any(\n"
                    '            "step" not in self.state[p]\n'
                    "            for _, _, p in self.named_params()\n"
                    "            if p.grad is not None\n"
                    "        ):\n            self._learn_codebook()\n",
                )
            },
        )
    ],
    "1.10.12": [
        (
            "a skipped call (found_inf) still advances the global step",
            {
                "optimizer": (
                    "        if not self._apply_grad_scaler():\n            return loss\n",
                    "        if not self._apply_grad_scaler():\n            self.global_step += 1\n"
                    "            return loss\n",
                )
            },
        ),
        (
            "the gradients stepped as the GradScaler left them, scaled",
            {"optimizer": ("local_tensor(p.grad).mul_(inverse)", "local_tensor(p.grad)")},
        ),
    ],
}

#: Section 1.13: torch semantics.
TORCH_SEMANTICS = {
    "1.13.9": [
        (
            "the gradient squared in float64",
            {"periods": ("local_grad.detach().float().square()", "local_grad.detach().double().square()")},
        )
    ],
    "1.13.1": [
        (
            "the factored square root as the reciprocal of a reciprocal square root, not torch.sqrt",
            {"steps": ("v_hat.div_(bc2).sqrt_()", "v_hat.div_(bc2).rsqrt_().reciprocal_()")},
        )
    ],
    "1.13.2": [
        (
            "the factored row sums accumulated in float64, not by torch's fp32 sum",
            {
                "steps": (
                    "row_sums[r0 : r0 + chunk_rows] = squares.sum(dim=1)",
                    "row_sums[r0 : r0 + chunk_rows] = squares.double().sum(dim=1).float()",
                )
            },
        )
    ],
    "1.13.3": [
        (
            "the block second moment's update as a multiply then an add (two roundings)",
            {
                "steps": (
                    ".add_(block_mean_square(grad_blocks), alpha=1 - hyper.beta2)",
                    ".add_(block_mean_square(grad_blocks).mul_(1 - hyper.beta2))",
                )
            },
        )
    ],
    "1.13.4": [
        (
            "the division by the row moments' mean as a reciprocal multiply",
            {"steps": (".div_(row_scale)", ".mul_(row_scale.reciprocal())")},
        )
    ],
    "1.13.5": [
        (
            "codewords decoded in fp32, not rounded to the gradient's dtype",
            {"codewords": ("return codebook[indices.long()].to(dtype)", "return codebook[indices.long()]")},
        )
    ],
    "1.13.6": [
        (
            "the power beta2 ** t evaluated in fp32",
            {
                "steps": (
                    'bc2 = 1 - hyper.beta2 ** state["vmean_step"]',
                    'bc2 = 1 - float(torch.tensor(hyper.beta2) ** state["vmean_step"])',
                )
            },
        )
    ],
    "1.13.7": [
        (
            "the decay factor of a bf16 parameter rounded to bf16, not fp32",
            {
                "steps": (
                    "        param.mul_(1 - hyper.lr * hyper.weight_decay)\n\n",
                    "        param.mul_(\n"
                    "            torch.tensor(1 - hyper.lr * hyper.weight_decay, dtype=param.dtype)\n"
                    "        )\n\n",
                )
            },
        )
    ],
}

#: SPEC 1.10.1 items 2-4, 1.10.2, 1.10.5: calls the reference refuses before anything changes;
#: each mutant is ``lenient`` (tests/test_rule_mutants.py): it leaves a check out, or makes it
#: after something changed.
REFUSED_CALLS = {
    "1.10.1#2": [
        (
            "the preflight after the GradScaler protocol (a found_inf call skips it)",
            {
                "optimizer": (
                    "        self._check_gradients()\n        if not self._apply_grad_scaler():\n"
                    "            return loss\n",
                    "        if not self._apply_grad_scaler():\n            return loss\n"
                    "        self._check_gradients()\n",
                )
            },
        )
    ],
    "1.10.2": [
        (
            "no check of the gradient's layout (a sparse gradient is stepped)",
            {"optimizer": ('if getattr(g, "is_sparse", False) or g.layout != torch.strided:', "if False:")},
        ),
        (
            "no check of the gradient's dtype (a complex gradient is stepped)",
            {"optimizer": ("if torch.is_complex(g):", "if False:")},
        ),
        (
            "no check of the gradient's shape (the same number of elements is stepped)",
            {"optimizer": ("if tuple(g.shape) != tuple(p.shape):", "if False:")},
        ),
    ],
    "1.10.5": [
        (
            "the global step advanced when the call begins, before its checks",
            {
                "optimizer": (
                    "        self._check_gradients()\n",
                    "        self.global_step += 1\n        self._check_gradients()\n",
                ),
            },
        ),
        (
            "the codebook learned before the preflight",
            {
                "optimizer": (
                    "        self._check_gradients()\n",
                    "        if self.codebook is None:\n            self._learn_codebook()\n"
                    "        self._check_gradients()\n",
                ),
            },
        ),
    ],
}

STEP = {**TENSOR_LR, **PERIODS, **CODEBOOK, **BLOCK_STEP, **FACTORED_STEP, **CALLS, **TORCH_SEMANTICS}


def make_optimizers() -> list:
    """``[(rule, kind, n, what, make_optimizer)]`` for every row of :data:`STEP` (kind ``wrong``)
    and of :data:`REFUSED_CALLS` (kind ``lenient``); ``n``: its row."""
    out = []
    for kind, table in (("wrong", STEP), ("lenient", REFUSED_CALLS)):
        for rule, rows in table.items():
            for n, (what, edits) in enumerate(rows):
                gefen = mutated_gefen(**edits)
                out.append((rule, kind, n, what, lambda params, _g=gefen, **kw: _g(params, **kw)))
    return out
