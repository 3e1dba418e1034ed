"""The appliance's numerics, defined once: every number the RTL, the functional simulator and the
compiler produce follows the functions in this module, bit for bit.

Formats
    Storage is IEEE binary16 (FP16). Arithmetic inside the units is IEEE binary32 (FP32).

Rules
    * FP16 x FP16 products are formed exactly in FP32 (11 x 11 significand bits fit in 24; the
      exponent range of the product fits FP32's normal range), so the multiplier never rounds.
    * FP32 additions are IEEE binary32 round-to-nearest-even with gradual underflow. (In the
      datapath FP32 subnormals cannot arise: every operand is a product or sum of FP16 values,
      a multiple of 2**-48; the GELU table flushes entries below 2**-40.)
    * FP32 -> FP16 conversion rounds to nearest even, overflows to +-Inf, keeps FP16 subnormals.
    * Any NaN produced by arithmetic is the canonical quiet NaN (FP16 0x7E00, FP32 0x7FC00000);
      max selects one of its inputs, so a NaN it returns keeps that input's bits.
    * Dot products (the MAC tree of the matrix unit and of the vector unit's VSUM/VDOT) are summed a
      tile of `width` FP16 pairs at a time by *block alignment* (`tile_sums`): each product is
      formed exactly as an integer significand (11 x 11 bits) and an exponent (the sum of the
      operands' exponent fields, subnormals as 1); the products are aligned to the largest exponent
      among the tile's nonzero products keeping TREE_GUARD_BITS more bits, each magnitude
      truncated toward zero, summed exactly as integers, and the sum rounded once to FP32 (RNE).
      The sum is exact wherever the tile's exponents lie within TREE_GUARD_BITS of each other, so
      the lane order does not matter. NaN (a NaN operand, Inf x 0, or +Inf and -Inf products) is
      the canonical NaN, else an Inf product gives Inf; a zero sum is -0 only if every product
      is -0. Inputs are zero-padded (+0) to a multiple of `width`; tile sums are accumulated
      sequentially in FP32, starting from the first tile's sum (`add_in_order`).
    * 8-bit weights (W8A16, `quantize_int8`): INT8 with one FP16 scale per output column. A tile is a buffer
      row of weights, 2 x mac_width (`int8_tile_sums`): its activations are aligned once to the largest
      (INT8_GUARD_BITS kept below its last bit, truncated toward zero), multiplied by the integer weights and
      summed exactly as integers, rounded to FP32 once; tile sums accumulate in FP32 as above, and the column's
      sum is multiplied by its scale (FP32, RNE) before the bias is added (`matmul`).
    * Vector operations take FP16 operands, compute in FP32 and round once to FP16 (for add, sub
      and mul this equals correctly rounded FP16 arithmetic, since 24 >= 2 * 11 + 2).
    * Max uses the total order -NaN < -Inf < ... < -0 < +0 < ... < +Inf < +NaN of the FP16 bit
      patterns (an integer comparison), so it is associative and the tree order does not matter.
    * Special functions (exp, reciprocal, reciprocal square root, GELU) are within one FP16 step
      of the correctly rounded result for every FP16 input (recip and rsqrt correctly rounded),
      with IEEE signed zeros and specials: exp by range reduction to 2**f (fixed point) and a
      64-entry table, recip and rsqrt by normalisation and a table indexed by the mantissa, GELU
      piecewise linear in the bit pattern with segments sized per region (see `special`).
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

GELU_C = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU (the tanh approximation, `gelu_new`), in float64, with its limits at
    +-Inf (gelu(-Inf) = -0, where the formula gives -Inf * 0)."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))
    return np.where(x == -np.inf, -0.0, y)


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

TREE_GUARD_BITS = 6
"""Bits a MAC tree keeps below the least significant bit of the product with the tile's largest
exponent: a term whose exponent is more than this below that one loses its low bits (truncated
toward zero: less than 2**(qmax - 56) each, under 2**-26 of the product of exponent sum qmax when
its operands are normal)."""
PRODUCT_SCALE = 2 * (FP16_BIAS + FP16_MAN_BITS)
"""An FP16 value is sig * 2**(e - 25) (e the exponent field, 1 for subnormals): a product of
exponent sum q is sig_x * sig_w * 2**(q - PRODUCT_SCALE)."""


def _fp16_operands(v) -> tuple:
    """FP16 values as (significand, exponent, sign, nan, inf, zero) int64/bool arrays: value =
    (-1)**sign * significand * 2**(exponent - 25); Inf and NaN have significand 0."""
    b = fp16_bits(v).astype(np.int64)
    exp, man = (b >> FP16_MAN_BITS) & 0x1F, b & 0x3FF
    special = exp == 0x1F
    sig = np.where(special, 0, np.where(exp == 0, man, man | (1 << FP16_MAN_BITS)))
    return sig, np.maximum(exp, 1), (b >> 15).astype(bool), special & (man != 0), special & (man == 0), \
        (exp == 0) & (man == 0)


def tile_sums(x, w) -> np.ndarray:
    """The MAC tree: the block-aligned sum of the exact products x * w (FP16, broadcast) along the
    last axis, one tile, in FP32 (see the module's rules). Exact products of exponent sum q are
    aligned to qmax, the largest q of the tile's nonzero products: magnitude * 2**TREE_GUARD_BITS
    >> (qmax - q), summed as signed integers, rounded to FP32 once."""
    sx, ex, negx, nanx, infx, zx = _fp16_operands(x)
    sw, ew, negw, nanw, infw, zw = _fp16_operands(w)
    product, q, neg = sx * sw, ex + ew, negx ^ negw
    qmax = np.max(np.where(product != 0, q, 0), axis=-1, keepdims=True)
    shift = np.clip(qmax - q, 0, 63)
    aligned = (product << TREE_GUARD_BITS) >> shift
    total = np.where(neg, -aligned, aligned).sum(axis=-1)
    with np.errstate(over="ignore"):
        value = np.ldexp(total.astype(np.float64), qmax[..., 0] - TREE_GUARD_BITS - PRODUCT_SCALE).astype(np.float32)
    all_neg_zero = np.all((zx | zw) & neg, axis=-1)
    value = np.where(total == 0, np.where(all_neg_zero, np.float32(-0.0), np.float32(0.0)), value)
    inf = infx | infw
    pos_inf, neg_inf = np.any(inf & ~neg, axis=-1), np.any(inf & neg, axis=-1)
    nan = np.any(nanx | nanw | (infx & zw) | (infw & zx), axis=-1) | (pos_inf & neg_inf)
    value = np.where(pos_inf, np.float32(np.inf), np.where(neg_inf, np.float32(-np.inf), value))
    return canonical_fp32(np.where(nan, np.float32(np.nan), value).astype(np.float32))


def add_in_order(sums, axis: int = -1) -> np.ndarray:
    """The tile accumulator: FP32 `sums` added in order along `axis`, starting from the first."""
    sums = np.moveaxis(np.asarray(sums, dtype=np.float32), axis, 0)
    acc = sums[0]
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(1, sums.shape[0]):
            acc = acc + sums[t]
    return canonical_fp32(acc)


def dot_tiles(x, w, width: int) -> np.ndarray:
    """Dot products of x and w (FP16, broadcast) along the last axis as the hardware forms them:
    zero-pad to a multiple of `width`, tile_sums per tile, tile sums added in order (FP32)."""
    if width < 1 or width & (width - 1):
        raise ValueError(f"adder tree width must be a power of two, got {width}")
    x, w = np.broadcast_arrays(np.asarray(x, np.float16), np.asarray(w, np.float16))
    k = x.shape[-1]
    tiles = max(1, -(-k // width))
    if tiles * width != k:
        pad = [(0, 0)] * (x.ndim - 1) + [(0, tiles * width - k)]
        x, w = np.pad(x, pad), np.pad(w, pad)
    shape = x.shape[:-1] + (tiles, width)
    return add_in_order(tile_sums(x.reshape(shape), w.reshape(shape)), axis=-1)


def reduce_sum(a, width: int, b=None, axis: int | None = None):
    """Vector reduce: sum of a (or of a * b) as the vector unit's MAC tree of `width` lanes forms it
    (dot_tiles of the pairs (a, b), b = 1 when None), rounded once to FP16. With `axis` None the sum
    runs over all elements (an FP16 scalar); otherwise along `axis` (an FP16 array; b broadcasts)."""
    a = np.asarray(a, np.float16)
    if axis is None:
        a, axis = a.ravel(), 0
        b = None if b is None else np.asarray(b, np.float16).ravel()
    if a.ndim == 2 and axis in (1, -1):
        sums = _row_sums_native(a, width, b)
        if sums is not None:
            return sums
    b = np.ones((), np.float16) if b is None else np.asarray(b, np.float16)
    a, b = np.broadcast_arrays(a, b)
    return to_fp16(dot_tiles(np.moveaxis(a, axis, -1), np.moveaxis(b, axis, -1), width))[()]


def _row_sums_native(a: np.ndarray, width: int, b=None) -> np.ndarray | None:
    """reduce_sum of each row of `a` (2-D), or of its exact products with b, through the compiled matrix kernel
    (hw/native.py: the same pairs, MAC tree, tile sums and rounding; a row alone is a product with ones, whose
    products are exact); None without the kernel."""
    from ringgpt.hw import native
    if not native.rounds_fp16() or width > native.MAX_WIDTH:
        return None
    if b is None:
        return native.matmul_fp16(a, np.ones((a.shape[1], 1), np.float16), width)[:, 0]
    b = np.asarray(b, np.float16)
    if b.shape != a.shape:
        b = np.broadcast_to(b, a.shape)
    return native.row_dots_fp16(a, b, width)


def max_key(x) -> np.ndarray:
    """Maps FP16 values to int32 keys whose integer order is the total order used by max."""
    bits = fp16_bits(x).astype(np.int32)
    return np.where(bits & 0x8000, 0x7FFF - (bits & 0x7FFF) - 0x8000, bits)


def reduce_max(x, axis: int = -1) -> np.ndarray:
    """Maximum of FP16 values under the total order of their bit patterns (see max_key)."""
    x = np.asarray(x, np.float16)
    # max_key as int16 (bits ^ 0x7FFF for negative patterns: the same integers), its inverse the same map.
    bits = x.view(np.int16)
    key = bits ^ ((bits >> 15) & 0x7FFF)
    top = np.max(key, axis=axis, keepdims=True)
    return (top ^ ((top >> 15) & 0x7FFF)).view(np.float16).squeeze(axis)


# --- the matrix unit ------------------------------------------------------------------------

MATMUL_BLOCK_TERMS = 1 << 18
"""Products `_matmul_acc_blocks` forms at once (a few MiB of int64 temporaries): blocks of rows x
columns are sized to this."""


def _matmul_acc(rows: np.ndarray, w: np.ndarray, width: int) -> np.ndarray:
    """FP32 accumulators of rows (M, K) against w (K, N), FP16 both: dot_tiles(row, column, width)
    per output element (the MAC tree per tile, then the tile accumulator): the compiled kernel
    (hw/native.py) when there is one, else `_matmul_acc_blocks`."""
    from ringgpt.hw import native
    out = native.matmul_acc(rows, w, width)
    return out if out is not None else _matmul_acc_blocks(rows, w, width)


def _matmul_acc_blocks(rows: np.ndarray, w: np.ndarray, width: int) -> np.ndarray:
    """_matmul_acc with dot_tiles over blocks of rows x columns (the fallback of the compiled kernel,
    and what the tests check it against)."""
    m, k = rows.shape
    n = w.shape[1]
    out = np.empty((m, n), np.float32)
    kp = max(1, -(-k // width)) * width
    mb = max(1, min(m, MATMUL_BLOCK_TERMS // kp))
    nb = max(1, min(n, MATMUL_BLOCK_TERMS // (mb * kp)))
    cols = np.asarray(w, np.float16).T
    for j0 in range(0, n, nb):
        for i0 in range(0, m, mb):
            out[i0:i0 + mb, j0:j0 + nb] = dot_tiles(rows[i0:i0 + mb, None, :], cols[None, j0:j0 + nb, :], width)
    return out


def matmul(x, w, width: int, bias=None, gelu: bool = False, scale=None) -> np.ndarray:
    """Matrix-unit result for rows x (M, K) or one vector x (K,) against w (K, N):
    per output element dot_tiles of the row and the column (the MAC tree of `width` per tile,
    tile sums added in order), then + bias in FP32, rounded to FP16, then GELU by lookup table when `gelu`.
    8-bit weights (w INT8, `scale` its N FP16 column scales): int8_matmul_acc's tiles of 2 x `width` weights
    instead, and the FP32 sum times the column's scale (`mul_fp32`) before the bias."""
    x = np.asarray(x, np.float16)
    int8 = np.asarray(w).dtype == np.int8
    if (scale is None) == int8:
        raise ValueError("matmul takes a scale exactly when its weights are INT8")
    w = np.asarray(w, np.int8 if int8 else np.float16)
    rows = np.atleast_2d(x)
    if rows.ndim != 2 or w.ndim != 2 or rows.shape[1] != w.shape[0]:
        raise ValueError(f"matmul shapes do not fit: x {x.shape}, w {w.shape} (want (M, K) or (K,) and (K, N))")
    if width < 1 or width & (width - 1):
        raise ValueError(f"adder tree width must be a power of two, got {width}")
    from ringgpt.hw import native
    out = None if int8 else native.matmul_fp16(rows, w, width, bias)
    if out is None:
        if int8:
            acc = mul_fp32(int8_matmul_acc(rows, w, width), np.asarray(scale, np.float16).astype(np.float32))
        else:
            acc = _matmul_acc(rows, w, width)
        if bias is not None and native.rounds_fp16():
            out = native.round_fp16(acc, bias)
        else:
            if bias is not None:
                acc = add_fp32(acc, np.asarray(bias, np.float16).astype(np.float32))
            out = to_fp16(acc)
    if gelu:
        out = special("gelu", out)
    return out if x.ndim == 2 else out[0]


# --- 8-bit weights (W8A16) -------------------------------------------------------------------

WEIGHT_FORMATS = ("fp16", "int8")
"""The matrix weights' formats: FP16, or INT8 with FP16 column scales (W8A16, `quantize_int8`)."""
INT8_LIMIT = 127
"""Largest magnitude of a quantised weight: symmetric, so -128 is never used."""


def quantize_int8(w) -> tuple[np.ndarray, np.ndarray]:
    """W8A16 weights (q, scale) of w (K, N): one FP16 scale per output column, the column's largest magnitude
    / 127 rounded to FP16 (at least the smallest FP16 subnormal; 1 for an all-zero column), and each weight
    round(w / scale) to nearest even, clipped to +-127. A column's scale enters once, after its k-sum (`matmul`), so
    nothing inside an INT8 tile depends on it."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_int8 takes a (K, N) weight matrix, got shape {w.shape}")
    peak = np.abs(w).max(axis=0) if w.shape[0] else np.zeros(w.shape[1], np.float32)
    tiny = np.float32(np.finfo(np.float16).smallest_subnormal)
    scale = np.where(peak > 0, np.maximum(peak / INT8_LIMIT, tiny), 1).astype(np.float16)
    q = np.clip(np.rint(w / scale.astype(np.float32)), -INT8_LIMIT, INT8_LIMIT).astype(np.int8)
    return q, scale


INT8_TILE_ROWS = 2
"""An INT8 tile is this many FP16 tiles' weights: a lane reads one buffer row of mac_width words a beat, 2 x mac_width
INT8 weights, so an INT8 MATMUL takes half the beats (isa.weight_words)."""
INT8_GUARD_BITS = 13
"""Bits an INT8 tile keeps of each activation below the least significant bit of its largest (`int8_tile_sums`):
the tile's activations, aligned once for every lane, are integers of at most 11 + 13 = 24 bits and sign (a DSP48E2's
27-bit port), their products with 8-bit weights and a tile's sum of 128 of them at most 38 bits (its 48-bit
accumulator; exact in float64 too)."""


INT8_GRID_SHIFT = FP16_BIAS + FP16_MAN_BITS + INT8_GUARD_BITS
"""An INT8 tile's grid is 2**(emax - INT8_GRID_SHIFT): INT8_GUARD_BITS below the least significant bit of an FP16
value of exponent field emax."""


def _int8_emax(x: np.ndarray) -> np.ndarray:
    """The largest exponent field among each tile's nonzero finite activations (x: (..., T) FP16; subnormals as 1;
    1 for none), keeping the tile axis."""
    sig, exp, _, _, _, _ = _fp16_operands(x)
    if x.shape[-1] == 0:
        return np.ones(x.shape[:-1] + (1,), np.int64)
    return np.max(np.where(sig != 0, exp, 1), axis=-1, keepdims=True)


def _int8_grid(x: np.ndarray) -> np.ndarray:
    """2**(emax - INT8_GRID_SHIFT) per tile (x: (..., T) FP16): the grid its activations are truncated to."""
    return np.ldexp(1.0, _int8_emax(x) - INT8_GRID_SHIFT)


def int8_tile_sums(x, q) -> np.ndarray:
    """The matrix unit's INT8 tile, its definition: x FP16 and q INT8 (broadcast), one tile along the last axis.
    Each activation is truncated toward zero to a multiple of the tile's grid (`_int8_grid`: INT8_GUARD_BITS below
    the largest activation's least significant bit, the same for every lane), the exact products with q summed
    exactly, rounded to FP32 once. NaN (a NaN activation, Inf x 0, or +Inf and -Inf products) is the canonical
    NaN, else an Inf product gives Inf; a zero sum is -0 only if every product is -0 (q = 0 counts as +0)."""
    x, q = np.broadcast_arrays(np.asarray(x, np.float16), np.asarray(q, np.int8))
    grid = _int8_grid(x)
    xf = x.astype(np.float64)
    finite = np.isfinite(xf)
    aligned = np.where(finite, np.trunc(np.where(finite, xf, 0) / grid) * grid, 0)
    total = (aligned * q).sum(axis=-1)            # exact: at most 38 significant bits
    value = total.astype(np.float32)
    _, _, negx, nanx, infx, zx = _fp16_operands(x)
    neg, zq = negx ^ (q < 0), q == 0
    all_neg_zero = np.all((zx | zq) & neg, axis=-1)
    value = np.where(total == 0, np.where(all_neg_zero, np.float32(-0.0), np.float32(0.0)), value)
    pos_inf, neg_inf = np.any(infx & ~zq & ~neg, axis=-1), np.any(infx & ~zq & neg, axis=-1)
    nan = np.any(nanx | (infx & zq), axis=-1) | (pos_inf & neg_inf)
    value = np.where(pos_inf, np.float32(np.inf), np.where(neg_inf, np.float32(-np.inf), value))
    return canonical_fp32(np.where(nan, np.float32(np.nan), value).astype(np.float32))


def int8_matmul_acc(rows, q, width: int) -> np.ndarray:
    """FP32 accumulators (M, N) of rows (M, K) FP16 against INT8 weights q (K, N): int8_tile_sums per tile of
    INT8_TILE_ROWS x `width` weights (zero-padded), tile sums added in order. The tiles' exact sums come from the
    compiled kernel (hw/native.py, int8_sums) or `_int8_sums`, are rounded to FP32 here; tiles with an infinite or
    NaN activation, and zero sums (their sign), take int8_tile_sums itself."""
    from ringgpt.hw import native
    rows, q = np.asarray(rows, np.float16), np.asarray(q, np.int8)
    (m, k), n = rows.shape, q.shape[1]
    tile = INT8_TILE_ROWS * width
    tiles = max(1, -(-k // tile))
    found = native.int8_sums(rows, q, tile)
    total, emax = found if found is not None else _int8_sums(rows, q, tile)
    sums = np.ldexp(total.astype(np.float64), (emax - INT8_GRID_SHIFT)[:, None, :])
    sums = sums.astype(np.float32)
    fix = (emax < 0)[:, None, :] | (total == 0)
    if fix.any():
        x = np.zeros((m, tiles * tile), np.float16)
        x[:, :k] = rows
        w = np.zeros((tiles * tile, n), np.int8)
        w[:k] = q
        i, j, t = np.nonzero(fix)
        sums[i, j, t] = int8_tile_sums(x.reshape(m, tiles, tile)[i, t], w.T.reshape(n, tiles, tile)[j, t])
    acc = sums[..., 0]
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(1, tiles):
            acc = canonical_fp32(acc + sums[..., t])
    return np.ascontiguousarray(acc)


def _int8_sums(rows: np.ndarray, q: np.ndarray, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """native.int8_sums in numpy (its fallback): the exact sums (M, N, tiles) as int64, each tile's activations
    truncated to its grid and multiplied by the weights in one float64 product (exact: every term a multiple of the
    grid, the sums within 53 bits), and emax (M, tiles), -1 where an activation is Inf or NaN."""
    (m, k), n = rows.shape, q.shape[1]
    tiles = max(1, -(-k // tile))
    total = np.empty((m, n, tiles), np.int64)
    emax = np.empty((m, tiles), np.int32)
    for t in range(tiles):
        xt, wt = rows[:, t * tile:(t + 1) * tile], q[t * tile:(t + 1) * tile]
        top = _int8_emax(xt)
        xf = xt.astype(np.float64)
        finite = np.isfinite(xf)
        aligned = np.trunc(np.ldexp(np.where(finite, xf, 0), INT8_GRID_SHIFT - top))
        total[:, :, t] = (aligned @ wt.astype(np.float64)).astype(np.int64)
        emax[:, t] = np.where(finite.all(axis=-1), top[:, 0], -1)
    return total, emax


def pack_int8(q) -> np.ndarray:
    """INT8 weights (..., K) as the FP16 words that hold them, two a word, the low byte first (an odd K padded with
    a zero byte): what HBM and WBUF hold (isa.weight_words)."""
    q = np.asarray(q, np.int8)
    if q.shape[-1] % 2:
        q = np.concatenate([q, np.zeros(q.shape[:-1] + (1,), np.int8)], axis=-1)
    return np.ascontiguousarray(q).view("<u2").astype(np.uint16).view(np.float16)


def unpack_int8(words, k: int) -> np.ndarray:
    """The first k INT8 weights held in FP16 words (..., ceil(k / 2)), two a word, the low byte first."""
    words = np.asarray(words, np.float16).view(np.uint16).astype("<u2", copy=False)   # no copy on little-endian hosts
    return words.view(np.int8)[..., :k]


def dequantize_int8(q, scale) -> np.ndarray:
    """The FP32 weights (K, N) that INT8 weights q and their FP16 column scales stand for: q x scale."""
    return np.asarray(q, np.float32) * np.asarray(scale, np.float16).astype(np.float32)


# --- the vector unit ------------------------------------------------------------------------

def _f32(a) -> np.ndarray:
    return np.asarray(a, np.float16).astype(np.float32)


# vadd, vsub and vmul: the FP32 operation (add_fp32, mul_fp16_exact) on FP16 operands, then to_fp16. numpy's FP16
# arithmetic is exactly that (each element converted to FP32, the operation, one round to nearest even to FP16), so
# they run as FP16 arithmetic and only NaNs are then given the canonical bits.

def _canonical_fp16(y) -> np.ndarray:
    y = np.asarray(y)
    nan = np.isnan(y)
    if nan.any():
        y = np.where(nan, fp16_from_bits(np.uint16(FP16_CANONICAL_NAN)), y)
    return y


def _elementwise_native(op: str, a: np.ndarray, b: np.ndarray, c=None):
    """The compiled kernel's vadd, vsub, vmul or vscale_shift (hw/native.py: the same FP32 operation, rounding and
    canonical NaN, tested against these definitions) where a holds the result's shape (1-D or 2-D) and the
    others broadcast to it; else None."""
    if a.ndim not in (1, 2) or b.ndim > a.ndim or (c is not None and c.ndim > a.ndim):
        return None
    from ringgpt.hw import native
    return native.elementwise_fp16(op, a, b, c)


def vadd(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float16), np.asarray(b, np.float16)
    out = _elementwise_native("add", a, b)
    if out is not None:
        return out
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return _canonical_fp16(np.add(a, b))


def vsub(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float16), np.asarray(b, np.float16)
    out = _elementwise_native("sub", a, b)
    if out is not None:
        return out
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return _canonical_fp16(np.subtract(a, b))


def vmul(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float16), np.asarray(b, np.float16)
    out = _elementwise_native("mul", a, b)
    if out is not None:
        return out
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return _canonical_fp16(np.multiply(a, b))


def vscale_shift(x, scale, shift) -> np.ndarray:
    """x * scale + shift: exact FP32 product, one rounded FP32 add, then rounded to FP16."""
    x, scale, shift = np.asarray(x, np.float16), np.asarray(scale, np.float16), np.asarray(shift, np.float16)
    out = _elementwise_native("scale_shift", x, scale, shift)
    if out is not None:
        return out
    with np.errstate(over="ignore", invalid="ignore"):
        return to_fp16(_f32(x) * _f32(scale) + _f32(shift))


# --- special functions ----------------------------------------------------------------------
#
# Each function has the evaluation its cost allows (the RTL in hw/arith/special.py follows these
# functions bit for bit; `lut_tables` generates every table it holds):
#   exp    range reduction in fixed point, t = x * log2(e) = k + f; 2**f from a 64-entry table
#          and linear interpolation, in fixed point too (24-bit result in [1, 2)); then the exact
#          scaling by 2**k and one rounding to FP16
#   recip  the input normalised to (1 + m / 1024) * 2**q; 1 / (1 + m / 1024) from a 1024-entry FP32
#          table, scaled exactly by 2**-q, rounded once to FP16
#   rsqrt  the same normalisation; 1 / sqrt(2**(q mod 2) * (1 + m / 1024)) correctly rounded to
#          FP16 in a 2048-entry table, then the exponent -floor(q / 2) added (results are always
#          normal FP16 numbers, so this is exact)
#   gelu   piecewise linear in the FP16 bit pattern with segments sized per region of the pattern
#          space (sign, exponent, top 2 mantissa bits); each segment a block floating-point entry
#          (integer base and slope, one exponent) of a 1024-entry table; |y| = (base + (slope * frac
#          >> 4)) * 2**exp exactly, with the input's sign, then one rounding to FP16

EXP_LOG2E_FRAC_BITS = 23
EXP_LOG2E = round(math.log2(math.e) * 2 ** EXP_LOG2E_FRAC_BITS)
"""log2(e) as an integer with EXP_LOG2E_FRAC_BITS fraction bits (24 bits: 12102203)."""
EXP_FRAC_BITS = 20
"""Fraction bits of the fixed-point t = x * log2(e) (truncated towards zero in magnitude)."""
EXP_K_BITS = 7
"""Bits of the signed integer part k of t (-64 ... 63)."""
EXP_SATURATE_EXP = FP16_BIAS + 5
"""FP16 exponent field from which |x| >= 32 (and Inf) saturate |t| to EXP_T_MAX (exp gives Inf or +0)."""
EXP_T_MAX = (1 << (EXP_FRAC_BITS + EXP_K_BITS - 1)) - 1
EXP_INDEX_BITS = 6
"""Top fraction bits of t that select an entry of the 2**f table (64 entries)."""
EXP_INTERP_BITS = EXP_FRAC_BITS - EXP_INDEX_BITS
"""The remaining fraction bits: the integer r that multiplies the slope (0 ... 2**14 - 1)."""
EXP_TABLE_FRAC_BITS = FP32_MAN_BITS
"""Fraction bits of the fixed-point 2**f: base entries are round(2**(i/64) * 2**23) (24 bits)."""
EXP_SLOPE_GUARD_BITS = 14
"""Extra fraction bits of the slope entries (18 bits); slope * r is truncated by as many bits."""

RECIP_TABLE_DEPTH = 1 << FP16_MAN_BITS
RSQRT_TABLE_DEPTH = 2 << FP16_MAN_BITS

GELU_REGION_BITS = 1 + FP16_EXP_BITS + 2
"""Top pattern bits (sign, exponent, top 2 mantissa bits) that select a GELU region (256 of them)."""
GELU_MAX_FRAC_BITS = 16 - GELU_REGION_BITS
"""A region of 256 patterns is cut into segments of 2**s patterns, s = 0 ... GELU_MAX_FRAC_BITS."""
GELU_TABLE_DEPTH = 1024
"""Entries of the GELU segment table; the segments of all regions must fit."""
GELU_TARGET_ULP = 0.25
"""Each region takes the largest segments whose interpolation error (before the final rounding)
stays within this many FP16 ulps of the float64 GELU at every pattern of the region."""
GELU_SIGNIFICAND_BITS = 23
"""GELU table entries are block floating point: per segment an exponent and integer base and
slope such that the magnitudes along the segment are integers below 2**(GELU_SIGNIFICAND_BITS + 1)
times 2**exp (the largest end of the segment has its top bit at 2**GELU_SIGNIFICAND_BITS)."""
GELU_SLOPE_GUARD_BITS = 4
"""Extra fraction bits of the slope entries: slope * frac is truncated by as many bits."""
GELU_FLUSH = 2.0 ** -40
"""Segments whose values are all smaller in magnitude hold zeros (they round to +-0 in FP16)."""
GELU_FLUSH_EXP = -GELU_SIGNIFICAND_BITS - 40
"""The exponent of flushed segments."""


def scale_fp32(p, k) -> np.ndarray:
    """p * 2**k for FP32 p, exactly (p and the result are normal FP32 numbers wherever the special
    functions use it: the hardware adds k to the exponent field)."""
    return np.ldexp(np.asarray(p, np.float64), np.asarray(k, np.int64)).astype(np.float32)


def _fp16_fields(x) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bits, sign, exponent field, mantissa field) of FP16 x, as int64 arrays."""
    bits = fp16_bits(x).astype(np.int64)
    return bits, bits >> 15, (bits >> FP16_MAN_BITS) & 0x1F, bits & 0x3FF


def fp16_normalise(exp: np.ndarray, man: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(e, m) with |x| = (1 + m / 1024) * 2**(e - 15) for finite nonzero FP16 x: subnormals are
    shifted left by the leading zeros lz of their 11-bit significand (e = 1 - lz, down to -9)."""
    sig = np.where(exp != 0, man | (1 << FP16_MAN_BITS), man)
    lz = (FP16_MAN_BITS + 1) - np.frexp(sig.astype(np.float64))[1]
    return np.maximum(exp, 1) - lz, (sig << lz) & 0x3FF


def _pattern_value(bits: np.ndarray) -> np.ndarray:
    """float64 value of FP16 bit patterns, continuing the exponent past 30 (0x7C00 -> 65536)."""
    bits = bits.astype(np.int64)
    sign = np.where(bits & 0x8000, -1.0, 1.0)
    exp = (bits >> FP16_MAN_BITS) & 0x1F
    man = bits & 0x3FF
    mag = np.where(exp == 0, man * 2.0 ** -24, (1024 + man) * 2.0 ** (exp.astype(np.float64) - 25))
    return sign * mag


def _fp16_spacing(y: np.ndarray) -> np.ndarray:
    """FP16 ulp at magnitude |y| (2**-24 in the subnormal range and at 0)."""
    mag = np.abs(y)
    exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    return 2.0 ** (np.maximum(exp, 1 - FP16_BIAS) - FP16_MAN_BITS)


def _gelu_segments(region: int, frac_bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base, slope, exp) of the 2**(GELU_MAX_FRAC_BITS - frac_bits) segments of GELU region
    `region` (see lut_tables)."""
    first = (region << GELU_MAX_FRAC_BITS) + (np.arange(1 << (GELU_MAX_FRAC_BITS - frac_bits)) << frac_bits)
    with np.errstate(all="ignore"):
        y0 = np.abs(gelu_tanh(_pattern_value(first)))
        y1 = np.abs(gelu_tanh(_pattern_value(first + (1 << frac_bits))))
    top = np.maximum(y0, y1)
    flush = top < GELU_FLUSH
    exp = np.where(flush, GELU_FLUSH_EXP,
                   np.floor(np.log2(np.where(flush, 1.0, top))).astype(np.int64) - GELU_SIGNIFICAND_BITS)
    unit = 2.0 ** -exp.astype(np.float64)
    base = np.where(flush, 0, np.round(y0 * unit)).astype(np.int64)
    slope = np.round((y1 - y0) * unit / (1 << frac_bits) * (1 << GELU_SLOPE_GUARD_BITS))
    slope = np.where(flush | (frac_bits == 0), 0, slope).astype(np.int64)
    return base, slope, exp


def _gelu_value(sign, base, slope, exp, frac) -> np.ndarray:
    """+-(base + (slope * frac >> GELU_SLOPE_GUARD_BITS)) * 2**exp as FP32 (exact: the magnitude
    is an integer below 2**(GELU_SIGNIFICAND_BITS + 1), the result a normal FP32 number or zero)."""
    magnitude = base + ((slope * frac) >> GELU_SLOPE_GUARD_BITS)
    return np.copysign(np.ldexp(magnitude.astype(np.float64), exp), np.where(sign == 1, -1.0, 1.0)).astype(np.float32)


def _gelu_region_error(region: int, frac_bits: int) -> float:
    """Largest interpolation error (before the final rounding) in the region, in FP16 ulps."""
    base, slope, exp = _gelu_segments(region, frac_bits)
    pattern = (region << GELU_MAX_FRAC_BITS) + np.arange(1 << GELU_MAX_FRAC_BITS)
    seg = (pattern & ((1 << GELU_MAX_FRAC_BITS) - 1)) >> frac_bits
    p = _gelu_value(pattern >> 15, base[seg], slope[seg], exp[seg], pattern & ((1 << frac_bits) - 1))
    with np.errstate(all="ignore"):
        ref = gelu_tanh(_pattern_value(pattern))
        return float(np.max(np.abs(p.astype(np.float64) - ref) / _fp16_spacing(ref.astype(np.float16).astype(np.float64))))


def _gelu_tables() -> dict[str, np.ndarray]:
    regions = 1 << GELU_REGION_BITS
    frac_bits = np.full(regions, GELU_MAX_FRAC_BITS, np.int64)
    offset = np.zeros(regions, np.int64)
    base, slope, exp = (np.zeros(GELU_TABLE_DEPTH, np.int64) for _ in range(3))
    exp[:] = GELU_FLUSH_EXP
    used = 0
    for region in range(regions):
        if ((region >> 2) & 0x1F) == 0x1F:               # Inf and NaN: no segments
            continue
        s = GELU_MAX_FRAC_BITS
        while s > 0 and _gelu_region_error(region, s) > GELU_TARGET_ULP:
            s -= 1
        b, d, e = _gelu_segments(region, s)
        if used + len(b) > GELU_TABLE_DEPTH:
            raise AssertionError(f"GELU segments exceed GELU_TABLE_DEPTH = {GELU_TABLE_DEPTH}")
        frac_bits[region], offset[region] = s, used
        base[used:used + len(b)], slope[used:used + len(b)], exp[used:used + len(b)] = b, d, e
        used += len(b)
    return {"frac_bits": frac_bits, "offset": offset, "base": base, "slope": slope, "exp": exp}


@functools.cache
def lut_tables(name: str) -> dict[str, np.ndarray]:
    """The tables of special function `name` (read-only arrays; the RTL's memories are initialised
    from them, there is no other copy):

    exp    base, slope: integers, 2**EXP_INDEX_BITS entries; entry i interpolates 2**f on
           [i, i + 1) / 64 in units of 2**-EXP_TABLE_FRAC_BITS: base = round(2**(i / 64) * 2**23),
           slope = round((2**((i + 1) / 64) - 2**(i / 64)) * 2**23): the change per step of r
           (2**-14 of the interval, EXP_INTERP_BITS) with EXP_SLOPE_GUARD_BITS = 14 more fraction
           bits (18 bits); 2**23 <= base + (slope * r >> 14) < 2**24 for every i and r
    recip  recip: FP32 1 / (1 + m / 1024) for m = 0 ... 1023
    rsqrt  rsqrt: FP16 1 / sqrt(2**odd * (1 + m / 1024)) at index odd * 1024 + m, correctly rounded
    gelu   frac_bits, offset: per region (the top GELU_REGION_BITS pattern bits) the segment size
           2**frac_bits and the region's first entry; base, slope, exp: integers, GELU_TABLE_DEPTH
           entries (866 used). Segment j covers GELU from its first pattern x0 to the next segment's
           first pattern x1 (pattern values continue past 0x7BFF: 0x7C00 -> 65536): exp =
           floor(log2(max |gelu(x0)|, |gelu(x1)|)) - GELU_SIGNIFICAND_BITS, base = |gelu(x0)| / 2**exp
           and slope = (|gelu(x1)| - |gelu(x0)|) / 2**exp per pattern with GELU_SLOPE_GUARD_BITS more
           fraction bits, both rounded to integers; zeros where everything is below GELU_FLUSH.
           The region sizes: the largest segments whose error stays within GELU_TARGET_ULP.
    """
    if name not in SPECIAL_FUNCTIONS:
        raise ValueError(f"unknown special function {name!r}; known: {sorted(SPECIAL_FUNCTIONS)}")
    if name == "exp":
        i = np.arange(1 << EXP_INDEX_BITS, dtype=np.float64)
        lo, hi = 2.0 ** (i / (1 << EXP_INDEX_BITS)), 2.0 ** ((i + 1) / (1 << EXP_INDEX_BITS))
        tables = {"base": np.round(lo * 2.0 ** EXP_TABLE_FRAC_BITS).astype(np.int64),
                  "slope": np.round((hi - lo) * 2.0 ** (EXP_TABLE_FRAC_BITS - EXP_INTERP_BITS + EXP_SLOPE_GUARD_BITS))
                  .astype(np.int64)}
    elif name == "recip":
        m = np.arange(RECIP_TABLE_DEPTH, dtype=np.float64)
        tables = {"recip": (1.0 / (1.0 + m / 1024)).astype(np.float32)}
    elif name == "rsqrt":
        index = np.arange(RSQRT_TABLE_DEPTH)
        value = 2.0 ** (index >> FP16_MAN_BITS) * (1.0 + (index & 0x3FF) / 1024)
        tables = {"rsqrt": (1.0 / np.sqrt(value)).astype(np.float16)}
    else:
        tables = _gelu_tables()
    for table in tables.values():
        table.setflags(write=False)
    return tables


def _exp(x) -> np.ndarray:
    _, sign, exp, man = _fp16_fields(x)
    sig = np.where(exp != 0, man | (1 << FP16_MAN_BITS), man)
    shift = FP16_BIAS + FP16_MAN_BITS + EXP_LOG2E_FRAC_BITS - EXP_FRAC_BITS - np.maximum(exp, 1)
    t = (sig * EXP_LOG2E) >> np.maximum(shift, 0)       # |t| * 2**EXP_FRAC_BITS, truncated
    t = np.where(exp >= EXP_SATURATE_EXP, EXP_T_MAX, t)
    t = np.where(sign == 1, -t, t)
    k = t >> EXP_FRAC_BITS                               # floor
    i = (t >> EXP_INTERP_BITS) & ((1 << EXP_INDEX_BITS) - 1)
    r = t & ((1 << EXP_INTERP_BITS) - 1)
    tables = lut_tables("exp")
    p = tables["base"][i] + ((tables["slope"][i] * r) >> EXP_SLOPE_GUARD_BITS)   # 2**f * 2**23, < 2**24
    return to_fp16(scale_fp32(p.astype(np.float32), k - EXP_TABLE_FRAC_BITS))


def _recip(x) -> np.ndarray:
    _, sign, exp, man = _fp16_fields(x)
    e, m = fp16_normalise(exp, man)
    value = np.where(sign == 1, -1.0, 1.0).astype(np.float32) * lut_tables("recip")["recip"][m]
    with np.errstate(over="ignore"):
        y = to_fp16(scale_fp32(value, FP16_BIAS - e))
    zero = (exp == 0) & (man == 0)
    inf = (exp == 0x1F) & (man == 0)
    return np.where(zero, np.where(sign == 1, -np.inf, np.inf).astype(np.float16),
                    np.where(inf, np.where(sign == 1, -0.0, 0.0).astype(np.float16), y))


def _rsqrt(x) -> np.ndarray:
    _, sign, exp, man = _fp16_fields(x)
    e, m = fp16_normalise(exp, man)
    q = e - FP16_BIAS
    value = lut_tables("rsqrt")["rsqrt"][((q & 1) << FP16_MAN_BITS) | m]
    y = np.ldexp(value.astype(np.float64), -(q >> 1)).astype(np.float16)
    zero = (exp == 0) & (man == 0)
    y = np.where(sign == 1, fp16_from_bits(np.uint16(FP16_CANONICAL_NAN)), y)
    y = np.where((exp == 0x1F) & (man == 0) & (sign == 0), np.float16(0.0), y)
    return np.where(zero, np.where(sign == 1, -np.inf, np.inf).astype(np.float16), y)


def _gelu(x) -> np.ndarray:
    bits, sign, exp, man = _fp16_fields(x)
    tables = lut_tables("gelu")
    region = bits >> GELU_MAX_FRAC_BITS
    s = tables["frac_bits"][region]
    seg = tables["offset"][region] + ((bits & ((1 << GELU_MAX_FRAC_BITS) - 1)) >> s)
    y = to_fp16(_gelu_value(sign, tables["base"][seg], tables["slope"][seg], tables["exp"][seg],
                            bits & ((1 << s) - 1)))
    inf = (exp == 0x1F) & (man == 0)
    return np.where(inf, np.where(sign == 1, -0.0, np.inf).astype(np.float16), y)


_EVALUATE = {"exp": _exp, "recip": _recip, "rsqrt": _rsqrt, "gelu": _gelu}


def _evaluate_special(name: str, x: np.ndarray) -> np.ndarray:
    """Special function `name` of FP16 x evaluated as the unit computes it (the definition `special` follows)."""
    y = np.asarray(_EVALUATE[name](x), np.float16).reshape(x.shape)
    _, _, exp, man = _fp16_fields(x)
    is_nan = (exp == 0x1F) & (man != 0)
    if is_nan.any():
        y = np.where(is_nan, fp16_from_bits(np.uint16(FP16_CANONICAL_NAN)), y)
    return y


@functools.cache
def special_table(name: str) -> np.ndarray:
    """Special function `name` at every FP16 bit pattern (65536 FP16 results, read-only, indexed by the input's
    bits): each unit's result depends on its 16-bit input alone, so it is evaluated once over all of them."""
    lut_tables(name)                                    # validates the name
    table = _evaluate_special(name, np.arange(1 << 16).astype(np.uint16).view(np.float16))
    table.setflags(write=False)
    return table


def special(name: str, x) -> np.ndarray:
    """Special function `name` of FP16 x (FP16 result), as the special-function units compute it
    (see lut_tables and the section comment above). NaN inputs give the canonical NaN."""
    x = np.asarray(x, np.float16)
    return special_table(name)[x.view(np.uint16).ravel()].reshape(x.shape)
