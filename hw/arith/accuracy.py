"""Measured accuracy of the special-function units (exactly what `numerics.special` and the RTL
compute) against the float64 functions, over all finite FP16 inputs and over the input ranges
the model uses. Run `python -m ringgpt.hw.arith.accuracy` for the Markdown table in
docs/numerics.md."""
from __future__ import annotations

import sys

import numpy as np

from .. import numerics as nx

RANGES = {
    "exp": (-16.0, 0.0),
    "recip": (1e-4, 1e4),
    "rsqrt": (1e-4, 1e4),
    "gelu": (-8.0, 8.0),
}
"""The input range that matters per function (softmax after max subtraction, layer-norm
variances and softmax denominators, the MLP's pre-activations)."""


def fp16_ulp(y: np.ndarray) -> np.ndarray:
    """Spacing of FP16 values at magnitude |y| (float64; 2**-24 in the subnormal range)."""
    mag = np.abs(y)
    exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    return 2.0 ** (np.maximum(exp, -14) - 10)


def special_accuracy(name: str, lo: float | None = None, hi: float | None = None) -> dict:
    """Error statistics of special(name, x) over finite FP16 x (within [lo, hi] when given).

    rel: |y - f(x)| / |f(x)| over inputs whose correctly rounded FP16 f(x) is a normal number
    (in the subnormal range the relative spacing of FP16 itself reaches 100 %); ulp: |y - f(x)| in
    FP16 ulps at f(x) over inputs whose rounded f(x) and y are finite and nonzero; exact: % of inputs
    where y equals f(x) rounded to nearest FP16 (Inf, zero and NaN results included, NaN equal to
    NaN); within_1ulp: % of inputs exactly rounded or within 1 ulp."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    x16 = nx.fp16_from_bits(bits)
    finite = np.isfinite(x16)
    x = x16[finite].astype(np.float64)
    if lo is not None:
        keep = (x >= lo) & (x <= hi)
        x = x[keep]
    y = nx.special(name, x.astype(np.float16)).astype(np.float64)
    with np.errstate(all="ignore"):
        ref = nx.SPECIAL_FUNCTIONS[name](x)
        rounded = ref.astype(np.float16).astype(np.float64)
    both_nan = np.isnan(y) & np.isnan(rounded)
    exact = (y == rounded) | both_nan
    measurable = np.isfinite(rounded) & (rounded != 0) & np.isfinite(y)
    with np.errstate(invalid="ignore"):
        err = np.abs(y - ref)
        ulp = np.where(measurable, err / fp16_ulp(ref), np.inf)
    normal = measurable & (np.abs(rounded) >= 2.0 ** -14)
    rel = err[normal] / np.abs(ref[normal])
    return {
        "inputs": int(x.size),
        "max_rel": float(rel.max()),
        "median_rel": float(np.median(rel)),
        "max_ulp": float(ulp[measurable].max()),
        "exact_pct": 100.0 * float(exact.mean()),
        "within_1ulp_pct": 100.0 * float((exact | (ulp <= 1.0)).mean()),
    }


def report() -> str:
    """Markdown table: each function over all finite FP16 inputs and over its range in RANGES."""
    lines = ["| function | inputs | count | max rel. error | median rel. error | max error (ulp) "
             "| exactly rounded | within 1 ulp |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, (lo, hi) in RANGES.items():
        for label, bounds in (("all finite FP16", (None, None)), (f"[{lo:g}, {hi:g}]", (lo, hi))):
            s = special_accuracy(name, *bounds)
            lines.append(f"| {name} | {label} | {s['inputs']} | {s['max_rel']:.3g} | {s['median_rel']:.3g} "
                         f"| {s['max_ulp']:.3g} | {s['exact_pct']:.2f} % | {s['within_1ulp_pct']:.2f} % |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(report() + "\n")
