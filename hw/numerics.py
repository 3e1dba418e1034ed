"""The appliance's numerics, defined once: every number the RTL, the functional simulator and the
compiler produce follows the functions in this module, bit for bit.

Formats
    Storage is IEEE binary16 (FP16). Arithmetic inside the units is IEEE binary32 (FP32).

Rules
    * FP16 x FP16 products are formed exactly in FP32 (11 x 11 significand bits fit in 24; the
      exponent range of the product fits FP32's normal range), so the multiplier never rounds.
    * FP32 additions are IEEE binary32 round-to-nearest-even with gradual underflow. (In the
      datapath FP32 subnormals cannot arise: every operand is a product or sum of FP16 values,
      a multiple of 2**-48; the lookup tables flush entries below 2**-40.)
    * FP32 -> FP16 conversion rounds to nearest even, overflows to +-Inf, keeps FP16 subnormals.
    * Any NaN produced by arithmetic is the canonical quiet NaN (FP16 0x7E00, FP32 0x7FC00000);
      max selects one of its inputs, so a NaN it returns keeps that input's bits.
    * Reductions use a *folding* adder tree over `width` lanes: while n > 1, v = v[:n/2] + v[n/2:]
      (lane i is added to lane i + n/2). Inputs are zero-padded (+0) to a multiple of `width`;
      tile sums are accumulated sequentially in FP32, starting from the first tile's sum.
    * Vector operations take FP16 operands, compute in FP32 and round once to FP16 (for add, sub
      and mul this equals correctly rounded FP16 arithmetic, since 24 >= 2 * 11 + 2).
    * Max uses the total order -NaN < -Inf < ... < -0 < +0 < ... < +Inf < +NaN of the FP16 bit
      patterns (an integer comparison), so it is associative and the tree order does not matter.
    * Special functions (exp, reciprocal, reciprocal square root, GELU) are piecewise linear in the
      FP16 bit pattern: the top LUT_INDEX_BITS bits of the input select a segment (base, slope),
      both FP32; the low LUT_FRAC_BITS bits are the integer `frac`, and
      y = to_fp16(base + slope * frac), a rounded FP32 multiply then a rounded FP32 add.
      `lut_tables` generates the table contents; the RTL's memories are initialised from it.
"""
from __future__ import annotations

import functools
import math

import numpy as np

FP16_EXP_BITS, FP16_MAN_BITS, FP16_BIAS = 5, 10, 15
FP32_EXP_BITS, FP32_MAN_BITS, FP32_BIAS = 8, 23, 127
FP16_CANONICAL_NAN = 0x7E00
FP32_CANONICAL_NAN = 0x7FC00000
FP16_NEG_INF = 0xFC00

LUT_SEGMENT_MAN_BITS = 5
"""Mantissa bits that, with sign and exponent, select a lookup-table segment."""
LUT_INDEX_BITS = 1 + FP16_EXP_BITS + LUT_SEGMENT_MAN_BITS
LUT_SEGMENTS = 1 << LUT_INDEX_BITS
LUT_FRAC_BITS = FP16_MAN_BITS - LUT_SEGMENT_MAN_BITS
LUT_CLAMP = 2.0 ** 17
"""Table values are clamped to +-LUT_CLAMP: anything beyond 65520 rounds to Inf in FP16 anyway."""
LUT_FLUSH = 2.0 ** -40
"""Table values smaller in magnitude are stored as zero (they round to 0 in FP16)."""
LUT_INF_PROXY = 2.0 ** 64
"""Infinite inputs are evaluated at this finite magnitude when the tables are built."""

GELU_C = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU (the tanh approximation, `gelu_new`), in float64."""
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))


SPECIAL_FUNCTIONS = {
    "exp": np.exp,
    "recip": lambda x: 1.0 / x,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "gelu": gelu_tanh,
}
"""The functions the special-function units compute, as float64 references."""


# --- bit patterns ---------------------------------------------------------------------------

def fp16_bits(x) -> np.ndarray:
    """FP16 values (or anything castable) as their uint16 bit patterns."""
    return np.asarray(x, dtype=np.float16).view(np.uint16)


def fp16_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint16).view(np.float16)


def fp32_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def fp32_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def canonical_fp32(x: np.ndarray) -> np.ndarray:
    """Replaces every NaN by the canonical FP32 NaN (the RTL never emits another payload)."""
    x = np.asarray(x, dtype=np.float32)
    nan = np.isnan(x)
    if not nan.any():
        return x
    return np.where(nan, fp32_from_bits(np.uint32(FP32_CANONICAL_NAN)), x)


# --- the arithmetic primitives --------------------------------------------------------------

def mul_fp16_exact(a, b) -> np.ndarray:
    """FP16 x FP16 -> FP32, exact (the multiplier of the matrix and vector units)."""
    with np.errstate(invalid="ignore"):
        return canonical_fp32(np.asarray(a, np.float16).astype(np.float32)
                              * np.asarray(b, np.float16).astype(np.float32))


def add_fp32(a, b) -> np.ndarray:
    """IEEE binary32 addition, round to nearest even, gradual underflow, canonical NaN."""
    with np.errstate(over="ignore", invalid="ignore"):
        return canonical_fp32(np.asarray(a, np.float32) + np.asarray(b, np.float32))


def mul_fp32(a, b) -> np.ndarray:
    """IEEE binary32 multiplication, round to nearest even (used by the lookup interpolation)."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        return canonical_fp32(np.asarray(a, np.float32) * np.asarray(b, np.float32))


def to_fp16(x) -> np.ndarray:
    """FP32 -> FP16: round to nearest even, overflow to Inf, FP16 subnormals kept, canonical NaN."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.asarray(x, dtype=np.float32).astype(np.float16)
    nan = np.isnan(y)
    if nan.any():
        y = np.where(nan, fp16_from_bits(np.uint16(FP16_CANONICAL_NAN)), y)
    return y


# --- reductions -----------------------------------------------------------------------------

def fold_tree(v: np.ndarray, axis: int = 0) -> np.ndarray:
    """Sums `v` along `axis` (a power-of-two length) with the folding adder tree, in FP32."""
    v = np.moveaxis(np.asarray(v, dtype=np.float32), axis, 0)
    n = v.shape[0]
    if n & (n - 1):
        raise ValueError(f"adder tree width must be a power of two, got {n}")
    with np.errstate(over="ignore", invalid="ignore"):
        while n > 1:
            n //= 2
            v = v[:n] + v[n:]
    return canonical_fp32(v[0])


def accumulate_tiles(terms: np.ndarray, width: int) -> np.ndarray:
    """Reduces FP32 `terms` along axis 0 as the hardware does: zero-pad to a multiple of `width`,
    fold each tile of `width` with the adder tree, then add the tile sums in order, in FP32."""
    terms = np.asarray(terms, dtype=np.float32)
    k = terms.shape[0]
    tiles = max(1, -(-k // width))
    if tiles * width != k:
        pad = np.zeros((tiles * width - k,) + terms.shape[1:], dtype=np.float32)
        terms = np.concatenate([terms, pad], axis=0)
    sums = fold_tree(terms.reshape((tiles, width) + terms.shape[1:]), axis=1)
    acc = sums[0]
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(1, tiles):
            acc = acc + sums[t]
    return canonical_fp32(acc)


def reduce_sum(a, width: int, b=None, axis: int | None = None):
    """Vector reduce: sum of a (or of a * b, products exact) over the vector unit's adder tree of
    `width` lanes, accumulated in FP32 across tiles, rounded once to FP16. With `axis` None the sum
    runs over all elements (an FP16 scalar); otherwise along `axis` (an FP16 array; b broadcasts)."""
    a = np.asarray(a, np.float16)
    if axis is None:
        a, axis = a.ravel(), 0
        b = None if b is None else np.asarray(b, np.float16).ravel()
    terms = a.astype(np.float32) if b is None else mul_fp16_exact(a, b)
    return to_fp16(accumulate_tiles(np.moveaxis(terms, axis, 0), width))[()]


def max_key(x) -> np.ndarray:
    """Maps FP16 values to int32 keys whose integer order is the total order used by max."""
    bits = fp16_bits(x).astype(np.int32)
    return np.where(bits & 0x8000, 0x7FFF - (bits & 0x7FFF) - 0x8000, bits)


def reduce_max(x, axis: int = -1) -> np.ndarray:
    """Maximum of FP16 values under the total order of their bit patterns (see max_key)."""
    x = np.asarray(x, np.float16)
    idx = np.argmax(max_key(x), axis=axis)
    return np.take_along_axis(x, np.expand_dims(idx, axis), axis=axis).squeeze(axis)


# --- the matrix unit ------------------------------------------------------------------------

MATMUL_BLOCK_FLOATS = 1 << 20
"""FP32 products `matmul` holds at once (4 MiB): blocks of rows x columns are sized to this."""
MATMUL_THREADS = 1
"""torch threads `matmul` runs on (restored afterwards): its blocks are too small to gain from
more, and spinning threads stall badly on a busy host."""


def _torch_view(a: np.ndarray):
    """A torch tensor sharing `a`'s memory (copied first if torch cannot view it)."""
    import torch
    if not a.flags.writeable or any(s < 0 for s in a.strides):
        a = a.copy()
    return torch.from_numpy(a)


def _matmul_acc(rows: np.ndarray, w: np.ndarray, width: int) -> np.ndarray:
    """FP32 accumulators of rows (M, K) against w (K, N), FP16 both: exactly
    accumulate_tiles(mul_fp16_exact(row, column), width) per output element (the MAC tree's
    fold_tree per tile, then the tile accumulator), computed blockwise with torch (IEEE binary32 multiplies and adds, no fusion) in the
    same order: products of zero-padded operands, the folding tree within each tile in place,
    then the tile sums added in order."""
    import torch
    m, k = rows.shape
    n = w.shape[1]
    tiles = max(1, -(-k // width))
    kp = tiles * width
    x32 = torch.zeros(m, kp)
    x32.narrow(1, 0, k).copy_(_torch_view(rows))
    wt = _torch_view(w.T)
    out = torch.empty(m, n)
    mb = max(1, min(m, MATMUL_BLOCK_FLOATS // kp))
    nb = max(1, min(n, MATMUL_BLOCK_FLOATS // (mb * kp)))
    w32 = torch.empty(nb, kp)
    if kp > k:
        w32.narrow(1, k, kp - k).zero_()
    products = torch.empty(mb * nb * kp)
    for j0 in range(0, n, nb):
        cols = min(nb, n - j0)
        wj = w32.narrow(0, 0, cols)
        wj.narrow(1, 0, k).copy_(wt.narrow(0, j0, cols))
        for i0 in range(0, m, mb):
            count = min(mb, m - i0)
            p = products.narrow(0, 0, count * cols * kp).view(count, cols, kp)
            torch.mul(wj, x32.narrow(0, i0, count).unsqueeze(1), out=p)
            v = p.view(count, cols, tiles, width)
            half = width
            while half > 1:
                half //= 2
                v.narrow(3, 0, half).add_(v.narrow(3, half, half))
            first, *rest = v.select(3, 0).unbind(2)
            acc = out.narrow(0, i0, count).narrow(1, j0, cols)
            acc.copy_(first)
            for tile in rest:
                acc.add_(tile)
    return out.numpy()


def matmul(x, w, width: int, bias=None, gelu: bool = False) -> np.ndarray:
    """Matrix-unit result for rows x (M, K) or one vector x (K,) against w (K, N):
    per output element accumulate_tiles of the exact products (the folding tree of `width` per
    tile, tile sums added in order), then + bias in FP32,
    rounded to FP16, then GELU by lookup table when `gelu`."""
    x = np.asarray(x, np.float16)
    w = np.asarray(w, np.float16)
    rows = np.atleast_2d(x)
    if rows.ndim != 2 or w.ndim != 2 or rows.shape[1] != w.shape[0]:
        raise ValueError(f"matmul shapes do not fit: x {x.shape}, w {w.shape} (want (M, K) or (K,) and (K, N))")
    if width < 1 or width & (width - 1):
        raise ValueError(f"adder tree width must be a power of two, got {width}")
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(MATMUL_THREADS)
    try:
        acc = _matmul_acc(rows, w, width)
    finally:
        torch.set_num_threads(threads)
    if bias is not None:
        acc = add_fp32(acc, np.asarray(bias, np.float16).astype(np.float32))
    out = to_fp16(acc)
    if gelu:
        out = special("gelu", out)
    return out if x.ndim == 2 else out[0]


# --- the vector unit ------------------------------------------------------------------------

def _f32(a) -> np.ndarray:
    return np.asarray(a, np.float16).astype(np.float32)


def vadd(a, b) -> np.ndarray:
    return to_fp16(add_fp32(_f32(a), _f32(b)))


def vsub(a, b) -> np.ndarray:
    return to_fp16(add_fp32(_f32(a), -_f32(b)))


def vmul(a, b) -> np.ndarray:
    return to_fp16(mul_fp16_exact(a, b))


def vscale_shift(x, scale, shift) -> np.ndarray:
    """x * scale + shift: exact FP32 product, one rounded FP32 add, then rounded to FP16."""
    return to_fp16(add_fp32(mul_fp16_exact(x, scale), _f32(shift)))


# --- special functions by lookup table --------------------------------------------------------

def _pattern_value(bits: np.ndarray) -> np.ndarray:
    """float64 value of FP16 bit patterns, continuing the exponent past 30 (0x7C00 -> 65536)."""
    bits = bits.astype(np.int64)
    sign = np.where(bits & 0x8000, -1.0, 1.0)
    exp = (bits >> FP16_MAN_BITS) & 0x1F
    man = bits & 0x3FF
    mag = np.where(exp == 0, man * 2.0 ** -24, (1024 + man) * 2.0 ** (exp.astype(np.float64) - 25))
    return sign * mag


@functools.cache
def lut_tables(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(base, slope) FP32 arrays of LUT_SEGMENTS entries for special function `name`.

    Segment s covers the FP16 patterns s << LUT_FRAC_BITS ... + 2**LUT_FRAC_BITS - 1. base is f at
    the segment's first pattern, slope the change per pattern step up to the next segment's first
    pattern; both clamped to +-LUT_CLAMP and flushed below LUT_FLUSH. Segments of Inf/NaN patterns
    hold f(+-LUT_INF_PROXY) and slope 0. A segment where f is undefined holds NaN (slope 0).
    """
    try:
        f = SPECIAL_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown special function {name!r}; known: {sorted(SPECIAL_FUNCTIONS)}") from None
    seg = np.arange(LUT_SEGMENTS, dtype=np.int64)
    first = seg << LUT_FRAC_BITS
    special_exp = ((first >> FP16_MAN_BITS) & 0x1F) == 0x1F
    x0 = _pattern_value(first)
    x1 = _pattern_value(first + (1 << LUT_FRAC_BITS))
    x0 = np.where(special_exp, np.sign(x0) * LUT_INF_PROXY, x0)
    with np.errstate(all="ignore"):
        y0, y1 = f(x0), f(x1)
    y1 = np.where(special_exp, y0, y1)
    undefined = np.isnan(y0) | np.isnan(y1)
    y0 = np.clip(np.nan_to_num(y0, nan=0.0), -LUT_CLAMP, LUT_CLAMP)
    y1 = np.clip(np.nan_to_num(y1, nan=0.0), -LUT_CLAMP, LUT_CLAMP)
    base = y0.astype(np.float32)
    slope = ((y1 - y0) / (1 << LUT_FRAC_BITS)).astype(np.float32)
    base[np.abs(base) < LUT_FLUSH] = 0.0
    slope[np.abs(slope) < LUT_FLUSH] = 0.0
    base[undefined] = fp32_from_bits(np.uint32(FP32_CANONICAL_NAN))
    slope[undefined] = 0.0
    base.setflags(write=False)
    slope.setflags(write=False)
    return base, slope


def special(name: str, x) -> np.ndarray:
    """Special function `name` of FP16 x by table lookup and linear interpolation (FP16 result).
    NaN inputs give the canonical NaN."""
    bits = fp16_bits(x)
    base, slope = lut_tables(name)
    seg = bits >> LUT_FRAC_BITS
    frac = (bits & ((1 << LUT_FRAC_BITS) - 1)).astype(np.float32)
    y = to_fp16(add_fp32(mul_fp32(slope[seg], frac), base[seg]))
    is_nan = ((bits & 0x7C00) == 0x7C00) & ((bits & 0x03FF) != 0)
    if is_nan.any():
        y = np.where(is_nan, fp16_from_bits(np.uint16(FP16_CANONICAL_NAN)), y)
    return y
