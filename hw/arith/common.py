"""Typed floating-point fields and the combinational building blocks the arithmetic units share:
a leading-zero counter, pipeline registers, and FP32 round-to-nearest-even packing.

The bit-level rules are those of `ringgpt.hw.numerics`; the format constants come from there.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data

from .. import numerics as nx

FP16 = data.StructLayout({"mant": nx.FP16_MAN_BITS, "exp": nx.FP16_EXP_BITS, "sign": 1})
"""IEEE binary16 bit fields (mantissa in the low bits)."""
FP32 = data.StructLayout({"mant": nx.FP32_MAN_BITS, "exp": nx.FP32_EXP_BITS, "sign": 1})
"""IEEE binary32 bit fields (mantissa in the low bits)."""

FP32_EXP_MAX = (1 << nx.FP32_EXP_BITS) - 1
FP16_EXP_MAX = (1 << nx.FP16_EXP_BITS) - 1
FP32_INF = FP32_EXP_MAX << nx.FP32_MAN_BITS
FP16_INF = FP16_EXP_MAX << nx.FP16_MAN_BITS


def check_power_of_two(what: str, width, minimum: int = 2) -> None:
    """Raises ValueError unless `width` is an int power of two >= `minimum`."""
    if isinstance(width, bool) or not isinstance(width, int) or width < minimum or width & (width - 1):
        raise ValueError(f"{what} width must be a power of two >= {minimum}, got {width!r}")


def register(m: Module, value, shape=None, *, name: str) -> Signal:
    """A pipeline register: a signal of `shape` (default: the shape of `value`) loaded from `value`
    on every clock edge."""
    reg = Signal(Value.cast(value).shape() if shape is None else shape, name=name)
    m.d.sync += reg.eq(value)
    return reg


def stage(m: Module, prefix: str, **values) -> dict:
    """One pipeline stage: registers every keyword value; returns the registers by name."""
    return {key: register(m, value, name=f"{prefix}_{key}") for key, value in values.items()}


def delay(m: Module, value, cycles: int, *, name: str):
    """`value` delayed by `cycles` pipeline registers (the value itself when `cycles` is 0)."""
    for n in range(cycles):
        value = register(m, value, name=f"{name}_d{n + 1}")
    return value


def leading_zeros(m: Module, value: Value, *, name: str) -> Signal:
    """Combinational count of leading zeros of `value` (its full width when `value` is 0): a balanced tree, whose
    node over a power-of-two span takes its upper half's count, else (that half all zero) its lower half's with the
    span's top count bit set, so the depth grows with log2 of the width (a priority chain over 35 bits was 13 LUT
    levels with the MAC tree's negation before it). `value` is padded below with a one to a power of two, which
    makes a zero `value` count its own width. Each node is a signal of its own, so the RTLIL stays linear in the
    width (an expression used twice is written out twice)."""
    width = len(Value.cast(value))
    held = Signal(width, name=f"{name}_of")
    m.d.comb += held.eq(value)
    pad = (1 << (width - 1).bit_length()) - width if width > 1 else 1
    padded = Cat(Const(1 << (pad - 1), pad), held) if pad else held
    count = Signal(range(width + 1), name=name)
    zero, tree = _count_leading_zeros(m, padded, name=name)
    m.d.comb += count.eq(Mux(zero, width, tree) if not pad else tree)
    return count


def trailing_zeros(m: Module, value: Value, *, name: str) -> Signal:
    """Combinational count of trailing zeros of `value` (its full width when 0): `leading_zeros` of its bits
    reversed, for sticky bits known before a shift (a set bit below position p after shifting right by s exists
    when s > trailing zeros + p)."""
    return leading_zeros(m, Value.cast(value)[::-1], name=name)


def _count_leading_zeros(m: Module, value: Value, *, name: str) -> tuple:
    """(value == 0, leading zeros of `value` below its power-of-two width) as signals, the tree of
    `leading_zeros`."""
    if len(value) == 1:
        return ~value[0], Const(0, 0)
    half = len(value) // 2
    low_zero, low = _count_leading_zeros(m, value[:half], name=f"{name}_l")
    high_zero, high = _count_leading_zeros(m, value[half:], name=f"{name}_h")
    zero, count = Signal(name=f"{name}_zero"), Signal(len(low) + 1, name=f"{name}_count")
    m.d.comb += [zero.eq(high_zero & low_zero), count.eq(Cat(Mux(high_zero, low, high), high_zero))]
    return zero, count


def is_nan32(x) -> Value:
    return (x.exp == FP32_EXP_MAX) & (x.mant != 0)


def is_inf32(x) -> Value:
    return (x.exp == FP32_EXP_MAX) & (x.mant == 0)


def round_pack_fp32(m: Module, sign: Value, exp: Value, sig: Value, *, name: str, sticky: Value | None = None) -> Signal:
    """Rounds a finite, nonzero FP32 magnitude to nearest even and packs it (combinational).

    `sig` holds 24 significand bits followed by at least one guard bit (its top bit is the hidden
    bit); `exp` is the biased exponent the value has when that top bit is set. A significand whose
    top bit is clear must come with `exp` == 1 (a subnormal). Exponents that reach 255 after
    rounding give Inf. `sticky`, when given, is whether a bit below the guard bit is set (a caller that knows it
    sooner than the OR of those bits of `sig`).
    """
    extra = len(sig) - 24
    assert extra >= 1
    keep = sig[extra:]
    guard = sig[extra - 1]
    if sticky is None:
        sticky = sig[:extra - 1].any() if extra > 1 else Const(0, 1)
    up = guard & (sticky | keep[0])
    rounded = Signal(25, name=f"{name}_rounded")
    m.d.comb += rounded.eq(keep + up)
    carry = rounded[24]
    mant = rounded[:23]         # a carry out leaves 2**24: its bits 0..23 are all 0, as rounded[1:24] would be
    exp_out = Signal(unsigned(len(exp) + 1), name=f"{name}_exp")
    m.d.comb += exp_out.eq(exp + carry)
    normal = carry | rounded[23]
    packed = Signal(32, name=name)
    # exp_out >= 255, with the exponent's comparisons made beside the rounding and only the carry after it
    overflow = (exp >= FP32_EXP_MAX) | ((exp == FP32_EXP_MAX - 1) & carry)
    with m.If(overflow):
        m.d.comb += packed.eq(Cat(Const(FP32_INF, 31), sign))
    with m.Else():
        m.d.comb += packed.eq(Cat(mant, Mux(normal, exp_out[:8], 0), sign))
    return packed


def register_fp32_result(m: Module, out: Value, *, nan: Value, inf: Value, zero: Value, sign: Value,
                         zero_sign: Value, packed: Value) -> None:
    """Registers into `out` the canonical NaN, a signed Inf, a signed zero, or else the rounded
    result `packed` (the last stage of the FP32 adder and multiplier)."""
    with m.If(nan):
        m.d.sync += out.eq(nx.FP32_CANONICAL_NAN)
    with m.Elif(inf):
        m.d.sync += out.eq(Cat(Const(FP32_INF, 31), sign))
    with m.Elif(zero):
        m.d.sync += out.eq(Cat(Const(0, 31), zero_sign))
    with m.Else():
        m.d.sync += out.eq(packed)


def round_sum_to_fp32(m: Module, out: Value, total: Value, top: Value, exp_offset: int, flags: dict,
                      flags_delay: int) -> None:
    """The last two stages of a tree's exact integer sum (the MAC tree's, the INT8 tile's): `total` (signed) stands
    for total * 2**(top + exp_offset - 127), FP32 biased exponent top + exp_offset + the index of its leading one.
    Registers its magnitude's leading and trailing zeros, then into `out` the rounded FP32 (RNE, the sticky bit
    from the trailing zeros), or from `flags` (nan, inf, inf_sign, all_neg_zero, delayed `flags_delay` cycles to
    the output) the canonical NaN, a signed Inf, or a signed zero for a zero sum."""
    magnitude = Signal(unsigned(len(total) - 1), name="magnitude")
    m.d.comb += magnitude.eq(Mux(total < 0, -total, total))
    n1 = stage(m, "n1", magnitude=magnitude, lz=leading_zeros(m, magnitude, name="lz"), sign=total < 0,
               trailing=trailing_zeros(m, magnitude, name="trailing"), zero=total == 0, top=top)
    normalised = Signal(len(magnitude), name="normalised")
    m.d.comb += normalised.eq(n1["magnitude"] << n1["lz"])
    exp = n1["top"] + (len(magnitude) - 1 + exp_offset) - n1["lz"]
    # a set bit below the guard bit (bit len - 25 of `normalised`): the lowest one, shifted up by lz, lies below it
    sticky = n1["trailing"] + n1["lz"] < len(magnitude) - 25
    packed = round_pack_fp32(m, n1["sign"], exp, normalised, name="packed", sticky=sticky)
    late = delay(m, Cat(flags["nan"], flags["inf"], flags["inf_sign"], flags["all_neg_zero"]), flags_delay,
                 name="flags")
    register_fp32_result(m, out, nan=late[0], inf=late[1], zero=n1["zero"], sign=late[2], zero_sign=late[3],
                         packed=packed)
