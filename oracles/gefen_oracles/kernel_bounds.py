"""What a correct kernel may change by rounding, stage by stage: the bounds of SPEC 5.6.

Every bound here follows from one rule (SPEC 5.6.1): *at each stage of the step a kernel may
round each operation to the precision at which the reference rounds there, or finer, in any
order, and may form ``1 - beta`` from ``beta`` rounded to fp32.* The functions turn that rule
into relative error bounds per stage, with ``U`` the fp32 unit roundoff ``2**-24`` (first-order
bounds; the constant terms are generous multiples of ``U`` so that second-order terms and
torch's 1-ulp square root are covered). Each function names its SPEC clause.

This module is the one source of every numeric bound the suite applies, in both profiles: the
rounding allowances of SPEC 5.6, the continuation bound of SPEC 5.3.3, the self-consistency
bounds of a reshard's re-save (SPEC 5.6.14) and the bounded save's memory (SPEC 5.4.2). Every
named bound is listed in :data:`STATED` with its clause and the profiles that apply it, and the
certificate's ``profile`` states them all (:func:`describe`, :func:`stated`); no other module
defines a tolerance (``tests/test_bounds_one_source.py``).

Nothing here compares anything; :mod:`gefen_oracles.pinned_step`, :mod:`gefen_oracles.free_running`,
:mod:`gefen_oracles.shadowing`, :mod:`gefen_oracles.codebook_quality`,
:mod:`gefen_oracles.checkpoint_compare` and the suite's checks apply these bounds.
"""

from __future__ import annotations

import math

import torch

#: fp32 unit roundoff (half an ulp of 1).
U = 2.0**-24
#: Unit roundoff of each dtype (half its ulp at 1).
UNIT_ROUNDOFF = {
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
    torch.float64: 2.0**-53,
}
SIGNIFICAND_BITS = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11, torch.float64: 53}

#: SPEC 3.7.3 / 5.3.3: one step after a reshard, max-abs against a native run (both profiles).
CONTINUATION_MAX_ABS = 5e-3
#: SPEC 5.6.24: the training stack's run against the reference's (tolerance profile): the
#: parameters at the end, max-abs, by the continuation bound ...
STACK_PARAMS_MAX_ABS = CONTINUATION_MAX_ABS
#: ... and every step's finite loss, relative.
STACK_LOSS_RTOL = 2e-3
#: SPEC 5.6.14: a reshard's re-save against the checkpoint it restored (both profiles). Each dense
#: momentum element is its nearest codeword in use times its new block's magnitude, up to the
#: rule's fp32 distances and the normalization (in units of the block magnitude) ...
RESHARD_REQUANTIZATION_ROUNDING = 8 * U
#: ... a slot's second-moment sum is kept by block means, up to fp32 summation (relative);
RESHARD_SECOND_MOMENT_SUM_RTOL = 1e-5
#: ... and every second-moment element stays within the saved values' range, and every block's
#: largest momentum magnitude at the restored block's, up to one fp32 rounding (relative).
RESHARD_RANGE_RTOL = 1e-6
#: SPEC 5.4.2: a planned save's peak extra memory: this many times the largest slot's dense form ...
SAVE_MEMORY_SLOTS = 2
#: ... plus this many bytes for the scalars and DCP's bookkeeping.
SAVE_MEMORY_SLACK_BYTES = 64 * 1024
#: SPEC 5.6.4: the block magnitude's own rounding, relative to it, beyond its block's largest
#: momentum error.
MAGNITUDE_ROUNDING = 2 * U
#: SPEC 5.6.6: the normalization's rounding (relative), and the tie rule's fp32 distances (absolute).
NORMALIZATION_ROUNDING = 4 * U
CODEWORD_DISTANCE_ROUNDING = 4 * U
#: SPEC 5.6.10: what a flip-free free-running step may add to the momentum's deviation per unit of
#: the grad dtype's codeword rounding and this floor, in block magnitudes ...
FREE_RUNNING_ROUNDINGS = 4.0
FREE_RUNNING_FLOOR = 1e-5
#: ... and to a second moment's relative error per step.
FREE_RUNNING_SECOND_MOMENT_PER_STEP = 3 * U
#: SPEC 5.6.11: a restore re-saved by two implementations: every momentum element within this many
#: times the slot's largest magnitude however its codeword flipped (a flip moves it within [-1, 1]).
RESTORE_MOMENTUM_RANGE = 2.0
#: SPEC 5.6.22: normalized dense momenta within this relative distance are one codeword in use.
CODEWORDS_IN_USE_MERGE = 8 * U
#: SPEC 5.6.9: the mean signed relative error of the updates may exceed the systematic bound by at
#: most this many standard errors of that mean.
BIAS_STANDARD_ERRORS = 4.0
#: SPEC 5.6.9: the statistic is formed only over at least this many distinct inputs.
BIAS_MIN_INPUTS = 16
#: SPEC 5.6.9: an element enters the bias statistic only when its update is at least this many
#: times its parameter's rounding allowance (an update lost to rounding is biased by construction).
VISIBLE_UPDATE_FACTOR = 8.0
#: SPEC 5.6.7: the learned codebook's cost on the reference's histogram may exceed the reference
#: codebook's by what moving this share of the elements (at least CODEBOOK_MIN_MOVED) by one bin
#: can cost.
CODEBOOK_MOVED_SHARE = 2.0**-9
CODEBOOK_MIN_MOVED = 8
HISTOGRAM_BIN_WIDTH = 2.0**-11
#: SPEC 5.6.23: a codebook seen only through the codewords a rank's dense momenta use is judged
#: with this multiple of SPEC 5.6.7's allowance (each side a subset of its codebook).
CODEWORDS_IN_USE_COST_FACTOR = 2.0
#: SPEC 5.6.11: a restore re-saved by two implementations: each momentum element within this
#: relative rounding (a maximum is exact, the normalization one division, the dense form one
#: multiply), except at most RESTORE_FLIP_SHARE of a slot's elements whose nearest codeword sat
#: within rounding of a decision boundary (expected share about 2 x 8U / 2^-11 = 2e-3 for codewords
#: a histogram bin apart; the bound is five times that).
RESTORE_ROUNDING = 8 * U
RESTORE_FLIP_SHARE = 0.01
#: ... and never fewer than this many elements: in a small slot one or two such flips already exceed
#: the share (2 of 192 elements is 1.04%), as SPEC 5.6.7 counts at least CODEBOOK_MIN_MOVED moved
#: elements.
RESTORE_MIN_FLIPS = 8


_BOTH = ("torch-exact", "tolerance")
_TOLERANCE = ("tolerance",)
#: Every named bound of this module: ``name -> (SPEC clause, the profiles that apply it, what it
#: bounds)``. The certificate's profile states each with its value (:func:`stated`).
STATED = {
    "CONTINUATION_MAX_ABS": ("5.3.3", _BOTH, "one step after a reshard against a native run: max-abs"),
    "STACK_PARAMS_MAX_ABS": (
        "5.6.24",
        _TOLERANCE,
        "the training stack's parameters at the end of a resumed run against the reference's: max-abs",
    ),
    "STACK_LOSS_RTOL": (
        "5.6.24",
        _TOLERANCE,
        "the training stack's loss at every step against the reference's",
    ),
    "RESHARD_REQUANTIZATION_ROUNDING": (
        "5.6.14",
        _BOTH,
        "a reshard's re-saved momentum: farther from the restored value than its nearest codeword in use "
        "(of the block magnitude)",
    ),
    "RESHARD_SECOND_MOMENT_SUM_RTOL": (
        "5.6.14",
        _BOTH,
        "a reshard's re-saved second-moment sum per slot against the checkpoint's: relative",
    ),
    "RESHARD_RANGE_RTOL": (
        "5.6.14",
        _BOTH,
        "a reshard's re-saved second moment within the saved range, and (tolerance) the slot's largest "
        "momentum magnitude: relative",
    ),
    "SAVE_MEMORY_SLOTS": (
        "5.4.2",
        _BOTH,
        "a planned save's peak extra memory: times the largest slot's dense form",
    ),
    "SAVE_MEMORY_SLACK_BYTES": ("5.4.2", _BOTH, "a planned save's peak extra memory: plus these bytes"),
    "MAGNITUDE_ROUNDING": ("5.6.4", _TOLERANCE, "a block magnitude's own rounding: relative"),
    "NORMALIZATION_ROUNDING": ("5.6.6", _TOLERANCE, "the normalized momentum's own rounding: relative"),
    "CODEWORD_DISTANCE_ROUNDING": ("5.6.6", _TOLERANCE, "the tie rule's fp32 distances: absolute"),
    "FREE_RUNNING_ROUNDINGS": ("5.6.10", _TOLERANCE, "momentum roundings per free-running step: factor"),
    "FREE_RUNNING_FLOOR": ("5.6.10", _TOLERANCE, "momentum rounding floor per free-running step"),
    "FREE_RUNNING_SECOND_MOMENT_PER_STEP": (
        "5.6.10",
        _TOLERANCE,
        "a free-running second moment's added relative error per step",
    ),
    "RESTORE_MOMENTUM_RANGE": (
        "5.6.11",
        _TOLERANCE,
        "a restore's momentum against the reference's restore: of the slot's largest magnitude",
    ),
    "CODEWORDS_IN_USE_MERGE": (
        "5.6.22",
        _TOLERANCE,
        "normalized dense momenta merged into one codeword: relative",
    ),
    "BIAS_STANDARD_ERRORS": (
        "5.6.9",
        _TOLERANCE,
        "the update bias beyond its systematic bound: standard errors",
    ),
    "BIAS_MIN_INPUTS": ("5.6.9", _TOLERANCE, "the update bias: fewest distinct inputs it is formed over"),
    "VISIBLE_UPDATE_FACTOR": (
        "5.6.9",
        _TOLERANCE,
        "elements in the bias statistic: update over its rounding",
    ),
    "CODEBOOK_MOVED_SHARE": (
        "5.6.7",
        _TOLERANCE,
        "the learned codebook's cost: share of elements moved one bin",
    ),
    "CODEBOOK_MIN_MOVED": ("5.6.7", _TOLERANCE, "the learned codebook's cost: fewest elements moved one bin"),
    "HISTOGRAM_BIN_WIDTH": ("5.6.7", _TOLERANCE, "the learned codebook's cost: the histogram's bin width"),
    "CODEWORDS_IN_USE_COST_FACTOR": (
        "5.6.23",
        _TOLERANCE,
        "a codebook learned after a restore, by its codewords in use: multiple of the 5.6.7 allowance",
    ),
    "RESTORE_ROUNDING": (
        "5.6.11",
        _TOLERANCE,
        "a restore's momentum elements against the reference's: relative",
    ),
    "RESTORE_FLIP_SHARE": (
        "5.6.11",
        _TOLERANCE,
        "a restore's momentum elements beyond rounding: share of a slot",
    ),
    "RESTORE_MIN_FLIPS": ("5.6.11", _TOLERANCE, "a restore's momentum elements beyond rounding: never fewer"),
}


def stated(profile: str) -> dict:
    """Every named bound the profile ``profile`` (``"torch-exact"`` or ``"tolerance"``) applies:
    ``{name: {"value", "clause", "bounds"}}``, for the certificate."""
    return {
        name: {"value": globals()[name], "clause": clause, "bounds": what}
        for name, (clause, profiles, what) in STATED.items()
        if profile in profiles
    }


def restore_flips_allowed(elements: int) -> float:
    """SPEC 5.6.11: the share of a slot's momentum elements a restore may move to another codeword:
    RESTORE_FLIP_SHARE, or RESTORE_MIN_FLIPS elements when that is more."""
    return max(RESTORE_FLIP_SHARE, RESTORE_MIN_FLIPS / elements) if elements else RESTORE_FLIP_SHARE


def restore_second_moment(elements: int) -> float:
    """SPEC 5.6.11: a restored slot's dense second moment against the reference's restore: a block
    mean of ``elements`` values and one rounding, ``(n + 4) U`` relative."""
    return (elements + 4) * U


def factored_v_hat(rows: int, row_error: float, col_error: float) -> float:
    """SPEC 5.6.5: relative error of ``V = v_row v_col^T / mean(v_row)`` from its rows' and columns'
    errors: their sum, the mean over ``rows`` values (its own error plus ``(rows + 1) U``) and 3U."""
    return row_error + col_error + (row_error + (rows + 1) * U) + 3 * U


def free_running_momentum_per_step(largest_gap: float, grad_dtype: torch.dtype) -> float:
    """SPEC 5.6.10: the momentum deviation, in block magnitudes, one free-running step may add: a
    codeword flip of at most ``largest_gap`` plus the step's roundings."""
    return largest_gap + FREE_RUNNING_ROUNDINGS * (codeword_rounding(grad_dtype) + FREE_RUNNING_FLOOR)


def free_running_second_moment(count: int, grad_dtype: torch.dtype, beta2: float, steps: int) -> float:
    """SPEC 5.6.10: a second moment after ``steps`` free-running steps: the pinned bound plus 3U per step."""
    return second_moment(count, grad_dtype, beta2) + FREE_RUNNING_SECOND_MOMENT_PER_STEP * steps


def save_memory_bound(largest_slot_bytes: int) -> int:
    """SPEC 5.4.2: the most extra bytes a planned save may hold at once."""
    return SAVE_MEMORY_SLOTS * int(largest_slot_bytes) + SAVE_MEMORY_SLACK_BYTES


def roundoff(dtype: torch.dtype) -> float:
    return UNIT_ROUNDOFF.get(dtype, U)


def codeword_rounding(grad_dtype: torch.dtype) -> float:
    """SPEC 1.13.5, 5.6.4: the reference rounds decoded codewords to the grad dtype (bf16, fp16), a
    kernel may keep them in fp32: relative difference up to the grad dtype's unit roundoff."""
    return roundoff(grad_dtype) if grad_dtype in (torch.bfloat16, torch.float16) else 0.0


def square_rounding(grad_dtype: torch.dtype) -> float:
    """SPEC 1.8.3, 5.6.2: bf16 squares and the bf16 block mean are each rounded to bf16 by the
    reference (two bf16 roundings); fp16 is promoted, fp32 squares in fp32."""
    return 2.0 * roundoff(torch.bfloat16) if grad_dtype == torch.bfloat16 else 0.0


def ema_weight(beta: float) -> float:
    """SPEC 5.6.3: relative error of ``1 - beta`` formed from fp32(beta): ``U*beta/(1-beta)``, plus
    the fp32 rounding of the weight. 6.0e-5 at beta = 0.999, 5.4e-7 at 0.9."""
    return U * beta / (1.0 - beta) + U if beta < 1.0 else math.inf


def mean_of_squares(count: int, grad_dtype: torch.dtype) -> float:
    """SPEC 5.6.2: a mean of ``count`` nonnegative fp32 squares summed in any order is within
    ``(count + 1) U`` (relative) of exact, plus the bf16 roundings of the reference."""
    return (count + 1) * U + square_rounding(grad_dtype)


def second_moment(count: int, grad_dtype: torch.dtype, beta2: float) -> float:
    """SPEC 5.6.3: ``beta2*v + (1-beta2)*q`` of nonnegative terms keeps the larger relative error
    of its terms plus the weight's and three roundings (multiply, fused or separate add)."""
    return mean_of_squares(count, grad_dtype) + ema_weight(beta2) + 3 * U


def stepsize(second_moment_error: float) -> float:
    """SPEC 5.6.5: ``(1/bc1) / (sqrt(v/bc2) + eps)``: half the second moment's relative error
    (square root; adding eps > 0 only shrinks it), plus square root (torch's may be 1 ulp off),
    bias-correction constants, add, reciprocal or division, multiply: 12 U."""
    return 0.5 * second_moment_error + 12 * U


def momentum(grad_dtype: torch.dtype, beta1: float) -> float:
    """SPEC 5.6.4: coefficient of ``|cur| + (1-beta1)|g|`` bounding the error of the new momentum
    ``beta1*cur + (1-beta1)*g`` before quantization: the codeword's rounding to the grad dtype,
    the weight, and six roundings (dequantize, difference or products, fused or separate add)."""
    return codeword_rounding(grad_dtype) + ema_weight(beta1) + 6 * U


def update(grad_dtype: torch.dtype, stepsize_error: float) -> float:
    """SPEC 5.6.8: relative error of ``lr * stepsize * codeword * magnitude``: the codeword's
    rounding to the grad dtype, the stepsize's error, lr's rounding and three multiplies."""
    return codeword_rounding(grad_dtype) + stepsize_error + 4 * U


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at ``|x|`` (float64 tensor; subnormal spacing near zero)."""
    bits = SIGNIFICAND_BITS.get(dtype, 24)
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(x.double().abs().clamp_min(info.tiny))
    return torch.ldexp(torch.ones_like(x, dtype=torch.float64), (exponent - bits).to(torch.int64))


def decay_rounding(p0: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SPEC 5.6.8: the reference's separate rounding of the decayed parameter ``p0 * (1 - lr*wd)``
    (half an ulp in the parameter dtype) and of the decay factor."""
    return 0.5 * ulp(p0, dtype) + 2 * U * p0.double().abs()


def parameter_rounding(p0: torch.Tensor, p1: torch.Tensor, dtype: torch.dtype, decayed: bool) -> torch.Tensor:
    """SPEC 5.6.8: absolute rounding a correct kernel may add to a parameter update: half an ulp of
    the result in the parameter dtype, an fp32 rounding before it, and, with weight decay, the
    reference's separate rounding of the decayed parameter and of the decay factor."""
    allowance = 0.5 * ulp(p1, dtype) + U * p1.double().abs()
    if decayed:
        allowance = allowance + decay_rounding(p0, dtype)
    return allowance


def codebook_cost_allowance(elements: int, largest_gap: float) -> float:
    """SPEC 5.6.7: moving ``k`` elements by one histogram bin ``w`` changes the optimal codebook's
    cost on the reference histogram by at most ``2 k w (G + w)`` (each moved element's distance to
    its nearest codeword changes by at most ``w``, twice: once per histogram), with ``G`` the
    largest gap between codewords; ``k`` is CODEBOOK_MOVED_SHARE of the elements (at least
    CODEBOOK_MIN_MOVED)."""
    k = max(CODEBOOK_MIN_MOVED, CODEBOOK_MOVED_SHARE * elements)
    w = HISTOGRAM_BIN_WIDTH
    return 2.0 * k * w * (largest_gap + w)


def codewords_in_use_cost_allowance(elements: int, largest_gap: float) -> float:
    """SPEC 5.6.23: :func:`codebook_cost_allowance` for two sets of codewords in use."""
    return CODEWORDS_IN_USE_COST_FACTOR * codebook_cost_allowance(elements, largest_gap)


def describe() -> dict:
    """The tolerance profile's rules and bounds, for the certificate (SPEC 5.6). Every entry names
    its clause; formulas use U = 2^-24 and rho_G (the grad dtype's unit roundoff where the
    reference rounds to it)."""
    examples = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        v = second_moment(64, dtype, 0.999)
        examples[name] = {
            "second_moment": v,
            "stepsize": stepsize(v),
            "update": update(dtype, stepsize(v)),
            "momentum_coefficient": momentum(dtype, 0.9),
        }
    return {
        "rule": "at each stage a kernel may round each operation to the precision at which the "
        "reference rounds "
        "there, or finer, in any order, and may form 1-beta from fp32(beta) (SPEC 5.6.1)",
        "exact": "counters, flags, periods, names, provenance, identities, hyperparameters, key sets, "
        "dtypes, shapes, "
        "checkpoint metadata and non-float values, restored model parameters, the tie rule on exact "
        "values, a loaded codebook (SPEC 5.6.6, 5.6.7, 5.6.11)",
        "pinned_step": {
            "how": "native-state-dict: the reference's state loaded into the implementation, one step "
            "from the same "
            "parameters and gradient, compared with float64 arithmetic of SPEC 1.8/1.9 (SPEC 5.6.1)",
            "mean_of_squares_rtol": "(n+1)U + 2^-7 for bf16 blocks (SPEC 5.6.2)",
            "second_moment_rtol": "mean_of_squares_rtol + U*beta2/(1-beta2) + 4U (SPEC 5.6.3)",
            "momentum_abs": "(rho_G + U*beta1/(1-beta1) + 6U)(|cur| + (1-beta1)|g|); magnitude: the "
            "block's worst "
            "plus 2U*mag (SPEC 5.6.4)",
            "stepsize_rtol": "second_moment_rtol/2 + 12U (SPEC 5.6.5)",
            "codeword_choice": "|c - u| <= min_k |cb_k - u| + 2 delta_u + 4U for every element (SPEC 5.6.6)",
            "update": "(rho_G + stepsize_rtol + 4U)|update| + half an ulp of the parameter dtype + "
            "U|p1| (+ half an ulp "
            "and 2U|p0| with weight decay) (SPEC 5.6.8)",
            "update_bias": f"mean signed relative error within the update rtol (+ the mean decay a decayed "
            f"parameter's rounding can lose, with weight decay) + {BIAS_STANDARD_ERRORS:g} standard "
            f"errors, elements with update >= {VISIBLE_UPDATE_FACTOR:g}x their rounding, identical "
            "inputs once (SPEC 5.6.9)",
            "U": U,
            "rho_G": {"float32": 0.0, "bfloat16": 2.0**-8, "float16": 2.0**-11},
            "examples_period_64_beta2_0.999": examples,
        },
        "codebook": {
            "structure": "fp32, 256 finite entries, sorted, -1 and +1 at the ends: exact (SPEC 5.6.7)",
            "quality": "bitwise the reference's, or its quantization cost on the reference's step-1 "
            "histogram at most "
            f"2k w (G + w) above the reference codebook's, w = 2^-11, k = max({CODEBOOK_MIN_MOVED}, "
            f"{CODEBOOK_MOVED_SHARE:g} x elements), G the reference's largest gap (SPEC 5.6.7)",
        },
        "free_running": {
            "momentum": "within tau = (G + 4(rho_G + 1e-5))(1 - beta1^T)/(1 - beta1) of the larger "
            "block magnitude "
            "(SPEC 5.6.10)",
            "parameters": "within tau x the accumulated largest update plus one parameter ulp per "
            "step; displacement "
            "bias as update_bias (SPEC 5.6.10)",
            "second_moment_rtol": "the pinned bound + 3U per step (SPEC 5.6.10)",
        },
        "checkpoints": {
            "same_implementation": "saves of one state by one implementation: byte for byte (SPEC 5.6.11)",
            "against_the_reference": "metadata and non-float values exact; dense momentum within tau (G: the "
            "reference codebook's largest gap, measured) of the slot's largest magnitude; "
            "dense second moment at the free-running bound (SPEC 5.6.11)",
            "restore_and_resave": "second moment within (n+4)U; momentum within "
            f"{RESTORE_ROUNDING / U:g}U relative "
            f"except at most {RESTORE_FLIP_SHARE:g} of a slot's elements, and never fewer than "
            f"{RESTORE_MIN_FLIPS} (SPEC 5.6.11)",
        },
        "continuation_after_reshard": {"max_abs": CONTINUATION_MAX_ABS, "clause": "5.3.3"},
        "bounds": stated("tolerance"),
        "shadowing": {
            "long_runs_and_loads": "every step of a long run and every step after a load is a pinned "
            "step from the "
            "implementation's own state before it: the pinned_step bounds per step, the "
            "update bias over all steps; counters, periods, inactive moments and the "
            "codebook exact at every step (SPEC 5.6.20)",
            "without_native_state": "long runs at the free-running bounds of their length and the "
            "displacement bias "
            "(SPEC 5.6.21)",
            "after_dcp_restores": "each step from the dense re-saves before and after it, the rank's "
            "codewords in use "
            "standing in for its codebook; non-float re-saved entries exact against the "
            "reference's restore-then-step (SPEC 5.6.22)",
        },
    }
