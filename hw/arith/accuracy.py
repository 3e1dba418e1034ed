"""Measured accuracy of the special-function units (exactly what `numerics.special` and the RTL
compute) against the float64 functions rounded correctly to FP16, over every FP16 input and over
the input ranges that matter. Run `python -m ringgpt.hw.arith.accuracy` for the Markdown table in
docs/numerics.md."""
from __future__ import annotations

import sys

import numpy as np

from .. import numerics as nx

RANGES = {
    "exp": [(-17.328125, 11.0859375), (-16.0, 0.0)],
    "recip": [(2.0 ** -24, 65504.0), (1e-4, 1e4)],
    "rsqrt": [(2.0 ** -24, 65504.0), (1e-4, 1e4)],
    "gelu": [(-65504.0, 65504.0), (-8.0, 8.0)],
}
"""Input ranges per function: the first is the stated range of the accuracy bound (exp: every
input whose correctly rounded result is finite and nonzero; recip and rsqrt: all positive normal
and subnormal FP16 numbers, negative ones by symmetry for recip; gelu: all finite inputs), the
second the range the model uses (softmax after max subtraction, layer-norm variances and softmax
denominators, the MLP's pre-activations). Every function is also measured over all 65,536 inputs."""


def fp16_ulp(y: np.ndarray) -> np.ndarray:
    """Spacing of FP16 values at magnitude |y| (float64; 2**-24 in the subnormal range)."""
    mag = np.abs(y)
    exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    return 2.0 ** (np.maximum(exp, -14) - 10)


def fp16_steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many FP16 values apart a and b are (non-NaN; +0 and -0 count as the same value)."""
    def line(x):
        bits = nx.fp16_bits(x).astype(np.int64)
        return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)
    return np.abs(line(a) - line(b))


def correctly_rounded(name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f(x) in float64, f(x) correctly rounded to FP16) for FP16 x."""
    with np.errstate(all="ignore"):
        ref = nx.SPECIAL_FUNCTIONS[name](np.asarray(x, np.float16).astype(np.float64))
        return ref, ref.astype(np.float16)


def special_accuracy(name: str, lo: float | None = None, hi: float | None = None) -> dict:
    """Error statistics of special(name, x) over every FP16 x (within [lo, hi] when given; NaN
    inputs only without bounds).

    ulp: |y - f(x)| in FP16 ulps at f(x), over inputs whose rounded f(x) and y are finite and
    nonzero (max_ulp, and where: the input x at the maximum); steps: how many FP16 values y lies
    from f(x) correctly rounded (Inf, zero and NaN results included; max_steps); wrong_zero_signs:
    inputs where both are zero with different signs; nan_mismatches: inputs where exactly one is
    NaN; rel: relative error over inputs whose rounded f(x) is a normal number; exact: % of inputs
    where y equals the correctly rounded f(x), sign of zero included (NaN equal to NaN);
    within_1ulp: % with at most one step and no wrong NaN or sign of zero."""
    x = nx.fp16_from_bits(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16))
    if lo is not None:
        with np.errstate(invalid="ignore"):
            x = x[(x >= lo) & (x <= hi)]
    y = nx.special(name, x)
    ref, rounded = correctly_rounded(name, x)
    y64, rounded64 = y.astype(np.float64), rounded.astype(np.float64)
    nan_y, nan_r = np.isnan(y), np.isnan(rounded)
    same_bits = nx.fp16_bits(y) == nx.fp16_bits(rounded)
    exact = same_bits | (nan_y & nan_r)
    nan_mismatch = nan_y != nan_r
    wrong_zero = (y == 0) & (rounded == 0) & ~same_bits
    steps = np.where(nan_y | nan_r, 0, fp16_steps(np.where(nan_y, 0, y), np.where(nan_r, 0, rounded)))
    measurable = np.isfinite(rounded64) & (rounded64 != 0) & np.isfinite(y64) & ~nan_y
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(y64 - ref)
        ulp = np.where(measurable, err / fp16_ulp(ref), 0.0)
    normal = measurable & (np.abs(rounded64) >= 2.0 ** -14)
    rel = err[normal] / np.abs(ref[normal])
    worst = int(np.argmax(ulp))
    return {
        "inputs": int(x.size),
        "max_rel": float(rel.max()) if rel.size else 0.0,
        "median_rel": float(np.median(rel)) if rel.size else 0.0,
        "max_ulp": float(ulp.max()),
        "where": float(x[worst]),
        "max_steps": int(steps.max()),
        "wrong_zero_signs": int(wrong_zero.sum()),
        "nan_mismatches": int(nan_mismatch.sum()),
        "exact_pct": 100.0 * float(exact.mean()),
        "within_1ulp_pct": 100.0 * float(((steps <= 1) & ~nan_mismatch & ~wrong_zero).mean()),
    }


def _bound(v: float) -> str:
    return "2⁻²⁴" if v == 2.0 ** -24 else f"{v:.9g}"


def report() -> str:
    """Markdown table: each function over all FP16 inputs and over its ranges in RANGES."""
    lines = [("| function | inputs | count | max error (ulp) | at x = | max steps from correctly rounded "
              "| exactly rounded | within 1 ulp | max rel. error |"),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, ranges in RANGES.items():
        bounds_list = [("all 65,536", (None, None))]
        bounds_list += [(f"[{_bound(lo)}, {_bound(hi)}]", (lo, hi)) for lo, hi in ranges]
        for label, bounds in bounds_list:
            s = special_accuracy(name, *bounds)
            lines.append(f"| {name} | {label} | {s['inputs']} | {s['max_ulp']:.3g} | {s['where']:.6g} "
                         f"| {s['max_steps']} | {s['exact_pct']:.2f} % | {s['within_1ulp_pct']:.2f} % "
                         f"| {s['max_rel']:.3g} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(report() + "\n")
