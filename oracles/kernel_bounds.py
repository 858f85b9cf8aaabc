"""What a correct kernel may change by rounding, stage by stage: the bounds of SPEC 5.6.

Every bound here follows from one rule (SPEC 5.6.1): *at each stage of the step a kernel may
round each operation to the precision at which the reference rounds there, or finer, in any
order, and may form ``1 - beta`` from ``beta`` rounded to fp32.* The functions turn that rule
into relative error bounds per stage, with ``U`` the fp32 unit roundoff ``2**-24`` (first-order
bounds; the constant terms are generous multiples of ``U`` so that second-order terms and
torch's 1-ulp square root are covered). Each function names its SPEC clause.

Nothing here compares anything; :mod:`oracles.pinned_step`, :mod:`oracles.free_running`,
:mod:`oracles.codebook_quality` and :mod:`oracles.checkpoint_compare` apply these bounds.
"""

from __future__ import annotations

import math

import torch

#: fp32 unit roundoff (half an ulp of 1).
U = 2.0 ** -24
#: Unit roundoff of each dtype (half its ulp at 1).
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float64: 2.0 ** -53}
SIGNIFICAND_BITS = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11, torch.float64: 53}

#: SPEC 3.7.3 / 5.3.3: one step after a reshard, max-abs against a native run (both profiles).
CONTINUATION_MAX_ABS = 5e-3
#: SPEC 5.6.9: the mean signed relative error of the updates may exceed the systematic bound by at
#: most this many standard errors of that mean.
BIAS_STANDARD_ERRORS = 4.0
#: SPEC 5.6.9: an element enters the bias statistic only when its update is at least this many
#: times its parameter's rounding allowance (an update lost to rounding is biased by construction).
VISIBLE_UPDATE_FACTOR = 8.0
#: SPEC 5.6.7: the learned codebook's cost on the reference's histogram may exceed the reference
#: codebook's by what moving this share of the elements (at least CODEBOOK_MIN_MOVED) by one bin
#: can cost.
CODEBOOK_MOVED_SHARE = 2.0 ** -9
CODEBOOK_MIN_MOVED = 8
HISTOGRAM_BIN_WIDTH = 2.0 ** -11
#: SPEC 5.6.11: a DCP checkpoint carries no codebook; its dense momentum is judged with this gap,
#: which every codebook the suite's workloads learn stays below (tests/test_kernel_bounds.py).
CHECKPOINT_LARGEST_GAP = 1.0 / 16


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


def parameter_rounding(p0: torch.Tensor, p1: torch.Tensor, dtype: torch.dtype, decayed: bool) -> torch.Tensor:
    """SPEC 5.6.8: absolute rounding a correct kernel may add to a parameter update: half an ulp of
    the result in the parameter dtype, an fp32 rounding before it, and, with weight decay, the
    reference's separate rounding of the decayed parameter and of the decay factor."""
    allowance = 0.5 * ulp(p1, dtype) + U * p1.double().abs()
    if decayed:
        allowance = allowance + 0.5 * ulp(p0, dtype) + 2 * U * p0.double().abs()
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


def describe() -> dict:
    """The tolerance profile's rules and bounds, for the certificate (SPEC 5.6)."""
    example = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        v = second_moment(64, dtype, 0.999)
        example[name] = {
            "codeword_rounding": codeword_rounding(dtype),
            "second_moment_rtol_period_64_beta2_0.999": v,
            "stepsize_rtol": stepsize(v),
            "update_rtol": update(dtype, stepsize(v)),
        }
    return {
        "rule": "at each stage a kernel may round each operation to the precision at which the reference rounds "
                "there, or finer, in any order, and may form 1-beta from fp32(beta) (SPEC 5.6.1)",
        "exact": "counters, flags, periods, names, identities, hyperparameters, dtypes, shapes, keys, checkpoint "
                 "metadata; an implementation's saves of one state compared with each other byte for byte (SPEC 5.6.11)",
        "pinned_step": {
            "how": "with native-state-dict, the reference's state is loaded into the implementation and one step "
                   "compared with exact float64 arithmetic of SPEC 1.8/1.9 from the same state, parameters and "
                   "gradient (SPEC 5.6.2-5.6.9)",
            "second_moment_rtol": "(P+1)U + 2 u_bf16 for bf16 squares + U*beta2/(1-beta2) + 4U (block of P); "
                                  "rows/columns alike (SPEC 5.6.2, 5.6.3)",
            "momentum": "each pre-quantization value within (rho_G + U*beta1/(1-beta1) + 6U)(|cur|+(1-beta1)|g|); "
                        "magnitude within the block's worst such error (SPEC 5.6.4)",
            "codeword_choice": "the chosen codeword at most twice the normalized value's error farther from the "
                               "exact normalized momentum than the nearest codeword (SPEC 5.6.6)",
            "update_rtol": "rho_G + stepsize_rtol + 4U of lr*stepsize*codeword*magnitude, stepsize_rtol = "
                           "second_moment_rtol/2 + 12U, plus half an ulp of the parameter dtype (SPEC 5.6.5, 5.6.8)",
            "update_bias": f"mean signed relative update error within update_rtol + {BIAS_STANDARD_ERRORS} standard "
                           f"errors, over elements whose update is at least {VISIBLE_UPDATE_FACTOR}x their "
                           "rounding allowance (SPEC 5.6.9)",
            "U": U,
            "rho_G": {"float32": 0.0, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11},
            "examples": example,
        },
        "codebook": {
            "structure": "fp32, 256 entries, finite, sorted, -1 and +1 at the ends: exact",
            "quality": "if not bitwise the reference's: its quantization cost on the reference's step-1 histogram "
                       f"at most 2 k w (G + w) above the reference codebook's, k = max({CODEBOOK_MIN_MOVED}, "
                       f"{CODEBOOK_MOVED_SHARE} x elements), w = 2^-11, G its largest gap (SPEC 5.6.7)",
        },
        "free_running": {
            "how": "trajectories and saved states after several steps, against the reference on the same gradients "
                   "(SPEC 5.6.10)",
            "second_moment_rtol": "the pinned bound plus 3U per step",
            "momentum_and_parameters": f"each element within {FREE_RUNNING_ELEMENT_BOUND} of its scale (block "
                                       "magnitude; accumulated largest update of its parameter, plus one parameter "
                                       f"ulp per step); at most {FREE_RUNNING_FLIP_SHARE} of the elements beyond the "
                                       "pinned rounding bound; mean signed relative error of the displacement as "
                                       "update_bias",
        },
        "continuation_after_reshard": {"max_abs": CONTINUATION_MAX_ABS, "clause": "5.3.3"},
    }
