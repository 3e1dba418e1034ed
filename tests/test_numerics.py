"""The fast paths of hw/numerics.py against straightforward element-by-element references written
here (Python loops over numpy float32 scalars, one IEEE operation at a time)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringgpt.hw import numerics as nm

SPECIAL_BITS = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
                0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00, 0x3555, 0x5BFF, 0x1000, 0x9000]


def fp16_arrays(shape_strategy):
    """Arrays of FP16 values: random normals mixed with zeros, subnormals, extremes, Inf and NaN."""
    bits = st.one_of(st.sampled_from(SPECIAL_BITS), st.integers(0, 0xFFFF),
                     st.integers(0x2000, 0x4C00), st.integers(0xA000, 0xCC00))
    return shape_strategy.flatmap(lambda shape: st.lists(bits, min_size=math.prod(shape), max_size=math.prod(shape))
                                  .map(lambda b: np.array(b, np.uint16).reshape(shape).view(np.float16)))


def ref_fp16(value: np.float32) -> int:
    """Bit pattern of an FP32 scalar rounded to FP16 (canonical NaN)."""
    if np.isnan(value):
        return nm.FP16_CANONICAL_NAN
    with np.errstate(over="ignore"):
        return int(np.float16(value).view(np.uint16))


def ref_tile_sum(pairs: list) -> np.float32:
    """The MAC tree's block-aligned sum of one tile of FP16 pairs, from its definition with Python integers: each
    product exactly as sig_x * sig_w * 2**(q - 50) (q the sum of the exponent fields, subnormals 1), aligned to the
    largest q among the nonzero products keeping TREE_GUARD_BITS more bits, truncated toward zero, summed, rounded
    once to FP32; NaN, Inf and the sign of a zero sum as IEEE sums of the products give them."""
    g = nm.TREE_GUARD_BITS
    terms = []
    for a, b in pairs:
        fa, fb = float(a), float(b)
        with np.errstate(invalid="ignore"):
            terms.append(np.float32(np.float32(fa) * np.float32(fb)))
    if any(np.isnan(t) for t in terms) or (any(t == np.inf for t in terms) and any(t == -np.inf for t in terms)):
        return np.float32(np.nan)
    if any(np.isinf(t) for t in terms):
        return np.float32(np.inf if any(t == np.inf for t in terms) else -np.inf)

    def split(v):
        p = int(np.float16(v).view(np.uint16))
        e, man = (p >> 10) & 0x1F, p & 0x3FF
        return (-1 if p >> 15 else 1) * (man | (1024 if e else 0)), max(e, 1)
    parts = [(split(a)[0] * split(b)[0], split(a)[1] + split(b)[1]) for a, b in pairs]
    live = [q for prod, q in parts if prod]
    if not live:
        return np.float32(-0.0) if all(np.signbit(t) for t in terms) else np.float32(0.0)
    qmax = max(live)
    total = 0
    for prod, q in (part for part in parts if part[0]):
        magnitude = (abs(prod) << g) >> (qmax - q)
        total += -magnitude if prod < 0 else magnitude
    return np.float32(math.ldexp(total, qmax - g - 50))


def ref_dot(x: np.ndarray, w_col: np.ndarray, width: int) -> np.float32:
    """Zero-pad to tiles of `width`, ref_tile_sum per tile, tile sums added in order in FP32."""
    pairs = list(zip(x, w_col))
    tiles = max(1, -(-len(pairs) // width))
    pairs += [(np.float16(0.0), np.float16(0.0))] * (tiles * width - len(pairs))
    acc = None
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(tiles):
            s = ref_tile_sum(pairs[t * width:(t + 1) * width])
            acc = s if acc is None else np.float32(acc + s)
    return acc


def ref_matmul_bits(x: np.ndarray, w: np.ndarray, width: int, bias=None) -> np.ndarray:
    out = np.zeros((x.shape[0], w.shape[1]), np.uint16)
    for m in range(x.shape[0]):
        for j in range(w.shape[1]):
            acc = ref_dot(x[m], w[:, j], width)
            if bias is not None:
                with np.errstate(over="ignore", invalid="ignore"):
                    acc = np.float32(acc + np.float32(bias[j]))
            out[m, j] = ref_fp16(acc)
    return out


def bits(a) -> np.ndarray:
    return np.asarray(a, np.float16).view(np.uint16)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), width=st.sampled_from([1, 2, 4, 8, 64]))
def test_matmul_matches_elementwise_reference(data, width):
    m = data.draw(st.integers(1, 3))
    k = data.draw(st.integers(1, 70))
    n = data.draw(st.integers(1, 6))
    x = data.draw(fp16_arrays(st.just((m, k))))
    w = data.draw(fp16_arrays(st.just((k, n))))
    bias = data.draw(st.one_of(st.none(), fp16_arrays(st.just((n,)))))
    got = nm.matmul(x, w, width, bias)
    assert np.array_equal(bits(got), ref_matmul_bits(x, w, width, bias))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), width=st.sampled_from([1, 4, 8, 64]))
def test_matmul_is_the_tree_and_accumulator_the_rtl_is_checked_against(data, width):
    """matmul (the simulator's matrix unit) before rounding equals tile_sums per tile (the RTL MAC tree's golden), then
    the tile sums added in order (add_in_order, the RTL tile accumulator's golden)."""
    k = data.draw(st.integers(1, 150))
    n = data.draw(st.integers(1, 5))
    x = data.draw(fp16_arrays(st.just((k,))))
    w = data.draw(fp16_arrays(st.just((k, n))))
    tiles = -(-k // width)
    xp = np.zeros(tiles * width, np.float16)
    wp = np.zeros((tiles * width, n), np.float16)
    xp[:k], wp[:k] = x, w
    acc = nm.add_in_order(nm.tile_sums(xp.reshape(tiles, 1, width), wp.T.reshape(n, tiles, width).transpose(1, 0, 2)),
                          axis=0)
    assert np.array_equal(bits(nm.matmul(x, w, width)), bits(nm.to_fp16(acc)))


@settings(max_examples=80, deadline=None)
@given(data=st.data(), width=st.sampled_from([2, 8, 64]), spread=st.integers(0, 24))
def test_tile_sum_is_within_the_stated_bound_of_the_exact_sum(data, width, spread):
    """tile_sums of finite pairs differs from the exact sum of the products by at most the truncated bits
    (2**(qmax - TREE_GUARD_BITS - 50) a term: for normal operands under 2**-26 of the product of exponent sum qmax)
    plus half an FP32 step of the result; within 2**(TREE_GUARD_BITS) of qmax it is the exact sum rounded once;
    and it does not depend on the order of the lanes."""
    mant = data.draw(st.lists(st.floats(-2, 2, allow_nan=False), min_size=2 * width, max_size=2 * width))
    exps = data.draw(st.lists(st.integers(-spread // 2 - 1, spread // 2 + 1), min_size=2 * width, max_size=2 * width))
    v = np.ldexp(np.array(mant), np.array(exps)).astype(np.float16)
    x, w = v[:width], v[width:]
    got = float(nm.tile_sums(x, w))
    exact = math.fsum(float(a) * float(b) for a, b in zip(x, w))
    # the product's exponent sum for every nonzero product, in float64 (a float16 product of two tiny subnormals
    # rounds to zero, though the tree sums it exactly)
    qs = [max((int(bits(a)) >> 10) & 31, 1) + max((int(bits(b)) >> 10) & 31, 1) for a, b in zip(x, w)
          if float(a) * float(b) != 0]
    if not qs:
        assert got == 0
        return
    qmax = max(qs)
    truncated = sum(1 for q in qs if qmax - q > nm.TREE_GUARD_BITS)
    half_ulp = np.spacing(np.float32(abs(got))) / 2 if got else 0
    assert abs(got - exact) <= truncated * 2.0 ** (qmax - nm.TREE_GUARD_BITS - 50) + half_ulp
    if truncated == 0:  # the exact sum has at most 34 significant bits: exact in a double
        assert np.float32(got) == np.float32(exact)
    order = np.array(data.draw(st.permutations(range(width))))
    assert nm.fp32_bits(nm.tile_sums(x[order], w[order])) == nm.fp32_bits(got)


def test_matmul_blocks_and_layouts_agree(monkeypatch):
    """Blocking over rows and columns, a column-major weight view, a 1-D x and GELU: same bits."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 37)) * 4).astype(np.float16)
    w_cols = rng.standard_normal((11, 37)).astype(np.float16)
    bias = rng.standard_normal(11).astype(np.float16)
    want = ref_matmul_bits(x, w_cols.T, 8, bias)
    assert np.array_equal(bits(nm.matmul(x, w_cols.T, 8, bias)), want)
    monkeypatch.setattr(nm, "MATMUL_BLOCK_TERMS", 50)  # 1 row x 1 column per block
    assert np.array_equal(bits(nm.matmul(x, np.ascontiguousarray(w_cols.T), 8, bias)), want)
    monkeypatch.setattr(nm, "MATMUL_BLOCK_TERMS", 200)  # 2 rows x 2 columns per block
    assert np.array_equal(bits(nm.matmul(x, w_cols.T, 8, bias)), want)
    assert np.array_equal(bits(nm.matmul(x[2], w_cols.T, 8, bias)), want[2])
    gelu = nm.matmul(x, w_cols.T, 8, bias, gelu=True)
    assert np.array_equal(bits(gelu), bits(nm.special("gelu", want.view(np.float16))))


def test_matmul_signed_zero_padding_and_cancellation():
    # All products -0: the zero padding of the last tile (+0) makes the sum +0.
    x = np.full((1, 3), -1.0, np.float16)
    w = np.zeros((3, 1), np.float16)
    assert bits(nm.matmul(x, w, 4))[0, 0] == 0x0000
    # With k a multiple of the width there is no padding, and -0 survives.
    assert bits(nm.matmul(np.full((1, 4), -1.0, np.float16), np.zeros((4, 1), np.float16), 4))[0, 0] == 0x8000
    # Inf - Inf inside a tile is the canonical NaN; an overflow rounds to Inf.
    inf = np.array([[np.inf], [-np.inf]], np.float16)
    assert bits(nm.matmul(np.ones((1, 2), np.float16), inf, 2))[0, 0] == nm.FP16_CANONICAL_NAN
    big = np.full((2, 1), 60000, np.float16)
    assert bits(nm.matmul(np.full((1, 2), 2.0, np.float16), big, 2))[0, 0] == 0x7C00


@pytest.mark.parametrize("m,k,n", [(0, 5, 3), (2, 0, 3), (2, 5, 0)])
def test_matmul_empty_dimensions(m, k, n):
    x, w = np.ones((m, k), np.float16), np.ones((k, n), np.float16)
    got = nm.matmul(x, w, 4)
    assert got.shape == (m, n) and np.array_equal(bits(got), ref_matmul_bits(x, w, 4))


def test_matmul_rejects_bad_shapes_and_widths():
    with pytest.raises(ValueError, match="shapes do not fit"):
        nm.matmul(np.zeros((2, 3), np.float16), np.zeros((4, 5), np.float16), 4)
    with pytest.raises(ValueError, match="power of two"):
        nm.matmul(np.zeros((2, 3), np.float16), np.zeros((3, 5), np.float16), 6)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), width=st.sampled_from([1, 2, 8, 64]), with_b=st.booleans())
def test_reduce_sum_matches_reference(data, width, with_b):
    n = data.draw(st.integers(1, 150))
    a = data.draw(fp16_arrays(st.just((n,))))
    b = data.draw(fp16_arrays(st.just((n,)))) if with_b else None
    ones = np.ones(n, np.float16)
    assert bits(nm.reduce_sum(a, width, b)) == ref_fp16(ref_dot(a, ones if b is None else b, width))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), width=st.sampled_from([2, 8]))
def test_reduce_sum_along_axis_equals_per_row(data, width):
    rows, n = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 40))
    a = data.draw(fp16_arrays(st.just((rows, n))))
    b = data.draw(fp16_arrays(st.just((rows, n))))
    got = nm.reduce_sum(a, width, b, axis=1)
    assert got.shape == (rows,)
    assert np.array_equal(bits(got), [bits(nm.reduce_sum(a[r], width, b[r])) for r in range(rows)])
    got_t = nm.reduce_sum(a.T, width, axis=0)
    assert np.array_equal(bits(got_t), [bits(nm.reduce_sum(a[r], width)) for r in range(rows)])


def ref_special(name: str, p: int) -> int:
    """special(name, x) for the FP16 pattern p, one pattern at a time from the documented
    algorithm (Python integers, math.frexp and numpy float32 scalars; finite nonzero inputs).
    exp: t = x * log2(e) with 20 fraction bits, k = floor(t), 2**f = base + slope * r >> 14 in
    units of 2**-23; recip, rsqrt: |x| = (1 + m / 1024) * 2**q; gelu: region, segment, frac,
    |y| = (base + slope * frac >> 4) * 2**exp."""
    tables = nm.lut_tables(name)
    sign, exp, man = p >> 15, (p >> 10) & 0x1F, p & 0x3FF
    x = float(np.uint16(p).view(np.float16))
    if name == "exp":
        sig = man | (1024 if exp else 0)
        if exp >= nm.EXP_SATURATE_EXP:
            t = nm.EXP_T_MAX
        else:  # |x| * log2(e) * 2**20 = sig * 2**(e - 25) * EXP_LOG2E * 2**(20 - 23), truncated
            t = (sig * nm.EXP_LOG2E) >> (25 + 23 - 20 - max(exp, 1))
        t = -t if sign else t
        k, f = t >> 20, t & ((1 << 20) - 1)
        i, r = f >> 14, f & ((1 << 14) - 1)
        two_f = int(tables["base"][i]) + ((int(tables["slope"][i]) * r) >> 14)    # 2**f * 2**23
        assert 1 << 23 <= two_f < 1 << 24
        return ref_fp16(np.float32(two_f * 2.0 ** (k - 23)))
    if name in ("recip", "rsqrt"):
        mf, ex = math.frexp(abs(x))                     # |x| = (1 + m / 1024) * 2**q
        m, q = int((2 * mf - 1) * 1024), ex - 1
        if name == "recip":
            value = float(tables["recip"][m]) * 2.0 ** -q
            return ref_fp16(np.float32(-value if sign else value))
        if sign:
            return nm.FP16_CANONICAL_NAN
        return int(np.float16(float(tables["rsqrt"][(q & 1) * 1024 + m]) * 2.0 ** -(q >> 1)).view(np.uint16))
    region = p >> 8
    s = int(tables["frac_bits"][region])
    seg = int(tables["offset"][region]) + ((p & 0xFF) >> s)
    magnitude = int(tables["base"][seg]) + ((int(tables["slope"][seg]) * (p & ((1 << s) - 1))) >> 4)
    assert 0 <= magnitude < 1 << 24
    return ref_fp16(np.float32(math.copysign(magnitude * 2.0 ** int(tables["exp"][seg]), -1.0 if sign else 1.0)))


@pytest.mark.parametrize("name", sorted(nm.SPECIAL_FUNCTIONS))
def test_special_matches_per_pattern_reference(name):
    every = np.arange(1 << 16, dtype=np.uint16)
    got = bits(nm.special(name, every.view(np.float16)))
    # Reference on a strided sample of patterns plus the finite nonzero corners (a full Python loop
    # is slow); zeros, Inf and NaN are checked in test_special_ieee_values.
    sample = np.concatenate([every[::37], np.array(SPECIAL_BITS, np.uint16)])
    for pattern in sample:
        p = int(pattern)
        if (p & 0x7C00) != 0x7C00 and p & 0x7FFF:
            assert got[p] == ref_special(name, p), (name, hex(p))


INF, NAN = np.inf, np.nan


@pytest.mark.parametrize("name, x, want", [
    ("exp", -INF, 0.0), ("exp", INF, INF), ("exp", 0.0, 1.0), ("exp", -0.0, 1.0), ("exp", -17.34375, 0.0),
    ("exp", -17.328125, 2.0 ** -24), ("exp", 11.0859375, math.exp(11.0859375)), ("exp", 11.09375, INF),
    ("exp", -65504.0, 0.0), ("exp", 65504.0, INF),
    ("recip", 0.0, INF), ("recip", -0.0, -INF), ("recip", INF, 0.0), ("recip", -INF, -0.0),
    ("recip", 2.0 ** -24, INF), ("recip", 2.0 ** -16, INF), ("recip", 65504.0, 1.0 / 65504.0),
    ("recip", -3.0, -1.0 / 3.0),
    ("rsqrt", 0.0, INF), ("rsqrt", -0.0, -INF), ("rsqrt", INF, 0.0), ("rsqrt", -INF, NAN), ("rsqrt", -1.0, NAN),
    ("rsqrt", -2.0 ** -24, NAN), ("rsqrt", 2.0 ** -24, 4096.0), ("rsqrt", 4.0, 0.5), ("rsqrt", 65504.0, 1.0 / math.sqrt(65504.0)),
    ("gelu", -INF, -0.0), ("gelu", INF, INF), ("gelu", 0.0, 0.0), ("gelu", -0.0, -0.0), ("gelu", -2.0 ** -24, -0.0),
    ("gelu", -2.0 ** -23, -2.0 ** -24), ("gelu", 2.0 ** -23, 2.0 ** -24), ("gelu", -10.0, -0.0), ("gelu", -65504.0, -0.0),
    ("gelu", 65504.0, 65504.0), ("gelu", 10.0, 10.0),
])
def test_special_ieee_values(name, x, want):
    """Signed zeros, infinities, invalid inputs and the ends of the ranges, as IEEE has them."""
    got = nm.special(name, np.array([x], np.float16))
    assert bits(got)[0] == bits(np.float16(want)) if not math.isnan(want) else bits(got)[0] == nm.FP16_CANONICAL_NAN


@pytest.mark.parametrize("name", sorted(nm.SPECIAL_FUNCTIONS))
def test_special_nan_inputs_give_the_canonical_nan(name):
    nans = np.array([0x7E00, 0xFE00, 0x7C01, 0xFC01, 0x7FFF, 0xFFFF], np.uint16).view(np.float16)
    assert (bits(nm.special(name, nans)) == nm.FP16_CANONICAL_NAN).all()


@pytest.mark.parametrize("name", sorted(nm.SPECIAL_FUNCTIONS))
def test_special_within_one_ulp_of_correctly_rounded(name):
    """Over every FP16 input: special(name, x) is at most one FP16 step from the float64 function
    correctly rounded to FP16 (as values; the rounded result itself or a neighbour), a zero has
    the sign of the correctly rounded zero, NaN exactly where the function is undefined, and where
    both results are finite and nonzero |y - f(x)| <= 1 ulp of f(x). That covers the stated
    ranges: exp on [-17.33, 11.09] (every input with a finite nonzero result), recip and rsqrt on
    all positive normal and subnormal inputs (recip negative ones too), gelu on all finite inputs."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    y = nm.special(name, x)
    with np.errstate(all="ignore"):
        f = nm.SPECIAL_FUNCTIONS[name](x.astype(np.float64))
        rounded = f.astype(np.float16)
    assert np.array_equal(np.isnan(y), np.isnan(rounded))
    ok = ~np.isnan(y)

    def line(v):  # FP16 values in order, one integer per value (+0 and -0 the same)
        b = bits(v).astype(np.int64)
        return np.where(b & 0x8000, -(b & 0x7FFF), b)

    steps = np.abs(line(y[ok]) - line(rounded[ok]))
    assert steps.max() <= 1, hex(int(bits(x[ok])[np.argmax(steps)]))
    zeros = ok & (y == 0) & (rounded == 0)
    assert np.array_equal(bits(y[zeros]), bits(rounded[zeros]))
    finite = ok & np.isfinite(y) & np.isfinite(rounded) & (rounded != 0) & (y != 0)
    yf, ff = y[finite].astype(np.float64), f[finite]
    ulp = 2.0 ** (np.maximum(np.floor(np.log2(np.abs(ff))), -14) - 10)
    assert (np.abs(yf - ff) <= ulp).all()
    if name == "exp":
        nonzero = ok & np.isfinite(rounded) & (rounded != 0)
        assert (x[nonzero].min(), x[nonzero].max()) == (np.float16(-17.328125), np.float16(11.0859375))


def test_special_tables_stay_in_their_ranges():
    """exp: 2**23 <= base + (slope * r >> 14) < 2**24 for every entry and r (a normalised 24-bit
    significand); gelu: every pattern's magnitude is an integer below 2**24, and the entries fit
    24-bit base and signed slope fields."""
    exp = nm.lut_tables("exp")
    r = np.arange(1 << nm.EXP_INTERP_BITS)
    p = exp["base"][:, None] + ((exp["slope"][:, None] * r) >> nm.EXP_SLOPE_GUARD_BITS)
    assert p.min() >= 1 << 23 and p.max() < 1 << 24
    gelu = nm.lut_tables("gelu")
    pattern = np.arange(1 << 16)
    finite = ((pattern >> 10) & 0x1F) != 0x1F
    region = pattern >> nm.GELU_MAX_FRAC_BITS
    s = gelu["frac_bits"][region]
    seg = gelu["offset"][region] + ((pattern & 0xFF) >> s)
    magnitude = gelu["base"][seg] + ((gelu["slope"][seg] * (pattern & ((1 << s) - 1))) >> nm.GELU_SLOPE_GUARD_BITS)
    assert magnitude[finite].min() >= 0 and magnitude[finite].max() < 1 << (nm.GELU_SIGNIFICAND_BITS + 1)
    assert gelu["base"].max() < 1 << 24 and np.abs(gelu["slope"]).max() < 1 << 23
    assert seg[finite].max() < nm.GELU_TABLE_DEPTH


def test_compiled_matmul_kernel_is_bit_exact_with_the_torch_path():
    """hw/native.py (when a C compiler is there) against numerics._matmul_acc_blocks: random, subnormal, signed-zero,
    infinite and NaN operands, widths 8 to 64, any K (zero padding), strided weight columns."""
    from ringgpt.hw import native
    if native.library() is None:
        pytest.skip("no compiled kernel on this machine (no C compiler, or RINGGPT_NATIVE=0)")
    rng = np.random.default_rng(11)
    for trial in range(40):
        m, k, n = int(rng.integers(1, 9)), int(rng.integers(1, 300)), int(rng.integers(1, 50))
        width = (8, 16, 64)[trial % 3]
        x = (rng.standard_normal((m, k)) * (1, 100, 1e-3, 3e4)[trial % 4]).astype(np.float16)
        w = (rng.standard_normal((k, n)) * (0.02, 1, 1e-5, 300)[trial % 4]).astype(np.float16)
        if trial % 5 == 0:
            x.flat[rng.integers(0, x.size, 3)] = (np.inf, -np.inf, np.nan)[trial % 3]
            w.flat[rng.integers(0, w.size, 3)] = np.float16(6e-8)
            x.flat[rng.integers(0, x.size, 3)] = -0.0
        w = w if trial % 2 else np.ascontiguousarray(w.T).T
        ours, torch_path = native.matmul_acc(x, w, width), nm._matmul_acc_blocks(x, w, width)
        nan = np.isnan(torch_path)
        assert np.array_equal(np.isnan(ours), nan)
        assert np.array_equal(ours[~nan].view(np.uint32), torch_path[~nan].view(np.uint32)), trial


def test_compiled_matmul_kernel_every_tile_width_and_layout():
    """hw/native.py's AVX2 paths (widths 8 ... 128: a tile's lanes in AVX2 registers, the last tile zero-padded)
    and its generic path (other widths) against the numpy path: K inside and across tile boundaries, strided rows
    and columns, rows sharing one address, special values."""
    from ringgpt.hw import native
    if native.library() is None:
        pytest.skip("no compiled kernel on this machine (no C compiler, or RINGGPT_NATIVE=0)")
    rng = np.random.default_rng(12)
    for trial, width in enumerate([1, 2, 4, 8, 16, 32, 64, 128, 256] * 6):
        m, n = int(rng.integers(1, 5)), int(rng.integers(1, 20))
        k = int((width * rng.integers(1, 4), width * rng.integers(1, 4) + rng.integers(1, width + 1), 1)[trial % 3])
        x = (rng.standard_normal((m, 2 * k)) * (1, 1e3, 1e-4)[trial % 3]).astype(np.float16)
        w = (rng.standard_normal((n, k + 3)) * (1, 1e-5, 300)[trial % 3]).astype(np.float16)
        x.flat[rng.integers(0, x.size, 2)] = (np.inf, -np.inf, np.nan, -0.0)[trial % 4]
        w.flat[rng.integers(0, w.size, 2)] = (np.float16(6e-8), -0.0, np.inf)[trial % 3]
        rows = x[:, ::2] if trial % 2 else x[:, :k]          # strided or contiguous rows
        if trial % 5 == 0:
            rows = np.broadcast_to(rows[:1], rows.shape)     # every row at one address
        cols = w[:, :k].T                                    # columns k + 3 words apart
        with np.errstate(over="ignore", invalid="ignore"):
            ours, want = native.matmul_acc(rows, cols, width), nm._matmul_acc_blocks(rows, cols, width)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(ours), nan), (trial, width)
        assert np.array_equal(ours[~nan].view(np.uint32), want[~nan].view(np.uint32)), (trial, width)


@pytest.mark.parametrize("name", sorted(nm.SPECIAL_FUNCTIONS))
def test_special_looks_up_the_evaluated_table_for_any_shape(name):
    """special() indexes special_table (the evaluation at every pattern, read-only) for arrays of any shape and
    layout, 0-d included."""
    table = nm.special_table(name)
    every = np.arange(1 << 16).astype(np.uint16).view(np.float16)
    assert not table.flags.writeable
    assert np.array_equal(bits(table), bits(nm._evaluate_special(name, every)))
    x = every.reshape(256, 256)[::3, 1::2]
    assert np.array_equal(bits(nm.special(name, x)), bits(nm._evaluate_special(name, np.ascontiguousarray(x))))
    scalar = nm.special(name, np.float16(0.5))
    assert isinstance(scalar, np.ndarray) and scalar.shape == () and bits(scalar) == bits(table[0x3800])


@pytest.mark.parametrize("op", ["vadd", "vsub", "vmul"])
def test_vector_fp16_arithmetic_is_the_fp32_operation_rounded_once(op):
    """vadd, vsub and vmul (numpy FP16 arithmetic, NaNs made canonical) against their definition, the FP32
    operation then to_fp16, for every FP16 pattern against special and random operands, both orders."""
    every = np.arange(1 << 16).astype(np.uint16).view(np.float16)
    rng = np.random.default_rng(5)
    others = np.concatenate([np.array(SPECIAL_BITS, np.uint16), rng.integers(0, 1 << 16, 40).astype(np.uint16)])
    fp32_op = {"vadd": np.add, "vsub": np.subtract, "vmul": np.multiply}[op]
    for b in others.view(np.float16):
        for x, y in ((every, np.full_like(every, b)), (np.full_like(every, b), every)):
            with np.errstate(over="ignore", invalid="ignore"):
                want = nm.to_fp16(fp32_op(x.astype(np.float32), y.astype(np.float32)))
            assert np.array_equal(bits(getattr(nm, op)(x, y)), bits(want)), (op, hex(int(bits(b))))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), width=st.sampled_from([1, 2, 8, 64, 128]), b_kind=st.sampled_from(["none", "rows", "scalar"]))
def test_reduce_sum_of_rows_equals_the_tree_path(data, width, b_kind):
    """reduce_sum along the rows of a 2-D block (the compiled kernel when present) against dot_tiles of the pairs,
    with no b, one b per row or a broadcast scalar."""
    rows, n = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 200))
    a = data.draw(fp16_arrays(st.just((rows, n))))
    b = {"none": None, "rows": data.draw(fp16_arrays(st.just((rows, n)))),
         "scalar": data.draw(fp16_arrays(st.just(())))}[b_kind]
    want = nm.to_fp16(nm.dot_tiles(a, np.float16(1.0) if b is None else b, width))
    assert np.array_equal(bits(nm.reduce_sum(a, width, b, axis=1)), bits(want))


def test_compiled_fp16_rounding_equals_to_fp16():
    """hw/native.py's FP32 -> FP16 conversion (F16C, with an FP16 bias added in FP32) against to_fp16(add_fp32(...)):
    every FP16 value, the FP32 values at and next to every midpoint between neighbours, the overflow edge, NaN
    payloads, random FP32 patterns (subnormals included)."""
    from ringgpt.hw import native
    if not native.rounds_fp16():
        pytest.skip("no compiled kernel with F16C on this machine")
    rng = np.random.default_rng(13)
    h = np.arange(1 << 16).astype(np.uint16).view(np.float16).astype(np.float32)
    finite = np.unique(h[np.isfinite(h)])
    mid = ((finite[1:].astype(np.float64) + finite[:-1]) / 2).astype(np.float32)
    up, down = np.float32(np.inf), np.float32(-np.inf)
    values = np.concatenate([h, mid, np.nextafter(mid, up), np.nextafter(mid, down),
                             np.array([65519.996, 65520, 65520.004, 3.4e38, 1e-30], np.float32),
                             (np.uint32(0x7F800000) | rng.integers(1, 1 << 23, 256).astype(np.uint32)).view(np.float32),
                             rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    values = np.concatenate([values, -values])
    acc = values[:values.size // 64 * 64].reshape(-1, 64)
    bias = np.array(SPECIAL_BITS + list(rng.integers(0, 1 << 16, 64 - len(SPECIAL_BITS))), np.uint16).view(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.array_equal(bits(native.round_fp16(acc)), bits(nm.to_fp16(acc)))
        assert np.array_equal(bits(native.round_fp16(acc, bias)), bits(nm.to_fp16(nm.add_fp32(acc, nm._f32(bias)))))


@pytest.mark.parametrize("op", ["vadd", "vsub", "vmul", "vscale_shift"])
def test_vector_ops_compiled_equal_numpy_definition(op):
    """The compiled element-wise kernel (hw/native.py, used by vadd, vsub, vmul and vscale_shift for 1-D and 2-D
    operands) against the numpy definitions, bit for bit: every FP16 pattern against special and random operands, with
    the broadcasts the vector unit uses (a scalar, one per row, a full block, strided views)."""
    from ringgpt.hw import native
    if not native.rounds_fp16():
        pytest.skip("no compiled kernel with F16C on this machine")
    rng = np.random.default_rng(21)
    every = np.arange(1 << 16).astype(np.uint16).view(np.float16)
    specials = np.array(SPECIAL_BITS, np.uint16).view(np.float16)
    np_ops = {"vadd": np.add, "vsub": np.subtract, "vmul": np.multiply}

    def reference(a, b, c):
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            if op == "vscale_shift":
                return nm.to_fp16(nm._f32(a) * nm._f32(b) + nm._f32(c))
            return nm._canonical_fp16(np_ops[op](a, b))

    def run(a, b, c):
        return nm.vscale_shift(a, b, c) if op == "vscale_shift" else getattr(nm, op)(a, b)

    block = every.reshape(256, 256)
    cases = [(every, np.float16(s), rng.integers(0, 1 << 16, every.size).astype(np.uint16).view(np.float16))
             for s in specials]
    cases += [(block, block[:, :1], block[::-1]), (block[::2, 1::3], block[1::2, :1], np.float16(0.5)),
              (block, block[7], specials[3]), (block[:, ::-1], block.T, block[:1, :])]
    for a, b, c in cases:
        a, b, c = (np.asarray(v, np.float16) for v in (a, b, c))
        for x, y in ((a, b), (b, a)) if op != "vscale_shift" and np.ndim(b) == np.ndim(a) else ((a, b),):
            got, want = run(x, y, c), reference(x, y, c)
            assert got.shape == want.shape and np.array_equal(bits(got), bits(want)), op


def test_compiled_matmul_threads_give_the_same_results():
    """hw/native.py shares a large product's columns among threads (set_threads): the results are those of one
    thread, bit for bit, and those of the numpy definition (_matmul_acc_blocks), specials and ragged tiles included."""
    from ringgpt.hw import native
    if native.library() is None:
        pytest.skip("no compiled kernel on this machine")
    rng = np.random.default_rng(34)
    x = rng.standard_normal((3, 700)).astype(np.float16)
    w = (rng.standard_normal((700, 1001)) * 4).astype(np.float16)
    x[1, 5], w[9, 17], w[300, 500] = np.inf, np.nan, -np.inf
    wanted = native._threads()
    try:
        native.library().set_threads(1)
        one = native.matmul_acc(x, w, 64)
        for threads in (2, 3, 7):
            native.library().set_threads(threads)
            assert np.array_equal(native.matmul_acc(x, w, 64).view(np.uint32), one.view(np.uint32)), threads
            assert np.array_equal(bits(native.matmul_fp16(x, w, 64)), bits(nm.to_fp16(one)))
    finally:
        native.library().set_threads(wanted)
    cols = [0, 17, 500, 501, 1000]
    assert np.array_equal(one[:, cols].view(np.uint32), nm._matmul_acc_blocks(x, w[:, cols], 64).view(np.uint32))
