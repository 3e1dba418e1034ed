"""Special-function units (exp, recip, rsqrt, gelu), bit-exact with `numerics.special`. Each
function has its own datapath (the evaluation numerics defines for it); every table is initialised
from `numerics.lut_tables(name)` and every constant comes from `numerics`:

exp    x * log2(e) in fixed point (an 11 x 24-bit product, shifted by the input's exponent and
       negated for x < 0) = k + f; a 64-entry (base, slope) table of integers read at the top 6 bits
       of f; base + (slope x r >> 14) (an 18 x 14-bit product, r the low 14 bits of f) is 2**f as
       a 24-bit significand, packed as FP32 with exponent 127 + k; FP32 -> FP16.
recip  the input normalised by its leading zeros; a 1024 x 32-bit table of 1 / (1 + m / 1024)
       (FP32); the exponent field scaled by 2**(15 - e); specials; FP32 -> FP16.
rsqrt  the same normalisation; a 2048 x 16-bit table of FP16 1 / sqrt(2**odd * (1 + m / 1024));
       -floor((e - 15) / 2) added to the FP16 exponent field; specials.
gelu   a 256-entry region ROM (segment size and first entry per sign, exponent and top two
       mantissa bits) gives the segment and frac; a 1024 x 56-bit table of block floating-point
       segments (base, slope, exponent); base + (slope x frac >> 4) (a 24 x 9-bit signed product)
       is the magnitude, normalised by its leading zeros into an FP32 number with the input's
       sign; FP32 -> FP16.

The units use no FP32 adder or multiplier: every value before the final FP32 -> FP16 conversion is
exact, fixed point or a table entry.

NaN inputs give the canonical NaN.
"""
from amaranth.hdl import C, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from .. import numerics as nx
from .common import FP16, FP16_EXP_MAX, FP16_INF, FP32, FP32_INF, leading_zeros, stage
from .stream import Streamed
from .to_fp16 import ToFP16Core

LATENCY = {
    # product; shift, negate and split; table read; slope x r; + base and 2**k; FP32 -> FP16
    "exp": 1 + 1 + 1 + 1 + 1 + ToFP16Core.latency,
    # normalise; table read; scale and specials; FP32 -> FP16
    "recip": 1 + 1 + 1 + ToFP16Core.latency,
    # normalise; table read; exponent and specials
    "rsqrt": 1 + 1 + 1,
    # region ROM and segment; table read; slope x frac; + base; normalise to FP32; FP32 -> FP16
    "gelu": 1 + 1 + 1 + 1 + 1 + ToFP16Core.latency,
}
"""Core latency in cycles per function (exp 7, recip 5, rsqrt 3, gelu 7)."""


GELU_FIELDS = {"base": nx.GELU_SIGNIFICAND_BITS + 1, "slope": nx.GELU_SIGNIFICAND_BITS + 1,
               "exp": nx.FP32_EXP_BITS}
"""Fields of a GELU segment entry, low bits first: base, slope (two's complement) and the FP32
exponent field of 2**(exp + GELU_SIGNIFICAND_BITS) (the biased exponent of the value whose top
bit is 2**GELU_SIGNIFICAND_BITS times 2**exp)."""


def gelu_entries(tables: dict) -> list[int]:
    """numerics.lut_tables("gelu")'s base, slope and exp packed as GELU_FIELDS."""
    width = GELU_FIELDS["base"]
    if max(int(abs(v)).bit_length() for v in tables["slope"]) >= GELU_FIELDS["slope"] \
            or int(tables["base"].max()).bit_length() > width:
        raise ValueError("GELU table entries do not fit GELU_FIELDS")
    return [int(b) | (int(d) & ((1 << width) - 1)) << width
            | int(e + nx.FP32_BIAS + nx.GELU_SIGNIFICAND_BITS) << (2 * width)
            for b, d, e in zip(tables["base"], tables["slope"], tables["exp"])]


def _table_init(table, bits_of) -> list[int]:
    return [int(v) for v in bits_of(table)]


class SpecialFunctionCore(wiring.Component):
    """Free-running special-function unit for `name` in numerics.SPECIAL_FUNCTIONS:
    `o` = special(name, i), FP16 -> FP16, `latency` = LATENCY[name] cycles (exp 7, recip 5,
    rsqrt 3, gelu 7). `tables` holds the memories' contents (name -> list of ints), taken from
    numerics.lut_tables(name): exp base and slope (64 x 24 and 64 x 18 bits), recip (1024 x 32), rsqrt
    (2048 x 16), gelu region (256 x 14: offset | frac_bits << 10) and segment (1024 x 56:
    GELU_FIELDS).
    """

    def __init__(self, name: str):
        tables = nx.lut_tables(name)
        self.name = name
        self.latency = LATENCY[name]
        if name == "exp":
            self.tables = {key: [int(v) for v in table] for key, table in tables.items()}
        elif name == "rsqrt":
            self.tables = {"rsqrt": _table_init(tables["rsqrt"], nx.fp16_bits)}
        elif name == "gelu":
            self.tables = {"region": [int(o) | int(s) << nx.FP16_MAN_BITS
                                      for o, s in zip(tables["offset"], tables["frac_bits"])],
                           "segment": gelu_entries(tables)}
        else:
            self.tables = {"recip": _table_init(tables["recip"], nx.fp32_bits)}
        super().__init__({"i": In(FP16), "o": Out(FP16)})

    def elaborate(self, platform):
        m = Module()
        getattr(self, f"_elaborate_{self.name}")(m)
        return m

    def _memory(self, m: Module, key: str, shape: int):
        m.submodules[key] = mem = memory.Memory(shape=shape, depth=len(self.tables[key]), init=self.tables[key])
        return mem

    # --- exp: fixed-point range reduction, 2**f by table and interpolation, exact 2**k ---------

    def _elaborate_exp(self, m: Module):
        x = self.i
        sig = Cat(x.mant, x.exp != 0)
        s1 = stage(m, "s1", product=sig * C(nx.EXP_LOG2E, nx.EXP_LOG2E_FRAC_BITS + 1),
                   exp=Mux(x.exp == 0, 1, x.exp), sign=x.sign, saturate=x.exp >= nx.EXP_SATURATE_EXP,
                   nan=(x.exp == FP16_EXP_MAX) & (x.mant != 0))

        # |t| * 2**EXP_FRAC_BITS = product >> (48 - EXP_FRAC_BITS - e), truncated; e <= 19 here
        t_bits = nx.EXP_FRAC_BITS + nx.EXP_K_BITS
        top = nx.FP16_BIAS + nx.FP16_MAN_BITS + nx.EXP_LOG2E_FRAC_BITS - nx.EXP_FRAC_BITS
        shift = Signal(range(top), name="s2_shift")
        m.d.comb += shift.eq(top - s1["exp"])
        magnitude = Signal(t_bits - 1, name="s2_magnitude")
        m.d.comb += magnitude.eq(Mux(s1["saturate"], nx.EXP_T_MAX, s1["product"] >> shift))
        t = Signal(signed(t_bits), name="s2_t")
        m.d.comb += t.eq(Mux(s1["sign"], -magnitude, magnitude))
        s2 = stage(m, "s2", index=t[nx.EXP_INTERP_BITS:nx.EXP_FRAC_BITS], r=t[:nx.EXP_INTERP_BITS],
                   k=t[nx.EXP_FRAC_BITS:], nan=s1["nan"])

        base = self._memory(m, "base", nx.EXP_TABLE_FRAC_BITS + 1)
        slope = self._memory(m, "slope", max(self.tables["slope"]).bit_length())
        base_rd, slope_rd = base.read_port(), slope.read_port()
        m.d.comb += [base_rd.addr.eq(s2["index"]), slope_rd.addr.eq(s2["index"])]
        s3 = stage(m, "s3", r=s2["r"], k=s2["k"], nan=s2["nan"])

        s4 = stage(m, "s4", product=slope_rd.data * s3["r"], base=base_rd.data, k=s3["k"], nan=s3["nan"])

        # 2**f * 2**23 in [2**23, 2**24): the FP32 significand; the exponent is 127 + k (63 ... 190)
        p = Signal(nx.EXP_TABLE_FRAC_BITS + 1, name="s5_p")
        m.d.comb += p.eq(s4["base"] + (s4["product"] >> nx.EXP_SLOPE_GUARD_BITS))
        scaled = Signal(FP32, name="scaled")
        m.d.sync += scaled.eq(Mux(s4["nan"], nx.FP32_CANONICAL_NAN,
                                  Cat(p[:nx.FP32_MAN_BITS], (nx.FP32_BIAS + s4["k"].as_signed())[:nx.FP32_EXP_BITS],
                                      C(0, 1))))
        m.submodules.to_fp16 = conv = ToFP16Core()
        m.d.comb += [conv.i.eq(scaled), self.o.eq(conv.o)]

    # --- recip and rsqrt: normalise, table of the significand's function, exponent arithmetic --

    def _normalise(self, m: Module) -> dict:
        """Stage 1 of recip and rsqrt: (e, m) with |x| = (1 + m / 1024) * 2**(e - 15)
        (numerics.fp16_normalise) and the input's class."""
        x = self.i
        sig = Cat(x.mant, x.exp != 0)
        lz = leading_zeros(m, sig, name="s1_lz")
        shifted = Signal(len(sig), name="s1_shifted")
        m.d.comb += shifted.eq(sig << lz)
        e = Signal(signed(nx.FP16_EXP_BITS + 2), name="s1_e")
        m.d.comb += e.eq(Mux(x.exp == 0, 1, x.exp) - lz)
        special = x.exp == FP16_EXP_MAX
        return stage(m, "s1", man=shifted[:nx.FP16_MAN_BITS], e=e, sign=x.sign,
                     zero=(x.exp == 0) & (x.mant == 0), inf=special & (x.mant == 0),
                     nan=special & (x.mant != 0))

    def _elaborate_recip(self, m: Module):
        s1 = self._normalise(m)
        table = self._memory(m, "recip", 32)
        rd = table.read_port()
        m.d.comb += rd.addr.eq(s1["man"])
        s2 = stage(m, "s2", **{key: s1[key] for key in ("e", "sign", "zero", "inf", "nan")})

        value = rd.data
        scale = Signal(signed(nx.FP16_EXP_BITS + 3), name="s2_scale")
        m.d.comb += scale.eq(nx.FP16_BIAS - s2["e"])
        scaled = Signal(FP32, name="scaled")
        with m.If(s2["nan"]):
            m.d.sync += scaled.eq(nx.FP32_CANONICAL_NAN)
        with m.Elif(s2["zero"]):
            m.d.sync += scaled.eq(Cat(Const(FP32_INF, 31), s2["sign"]))
        with m.Elif(s2["inf"]):
            m.d.sync += scaled.eq(Cat(Const(0, 31), s2["sign"]))
        with m.Else():  # table values are in (0.5, 1]: the exponent field stays within 111 ... 151
            m.d.sync += scaled.eq(Cat(value[:nx.FP32_MAN_BITS],
                                      (value[nx.FP32_MAN_BITS:31] + scale)[:nx.FP32_EXP_BITS], s2["sign"]))
        m.submodules.to_fp16 = conv = ToFP16Core()
        m.d.comb += [conv.i.eq(scaled), self.o.eq(conv.o)]

    def _elaborate_rsqrt(self, m: Module):
        s1 = self._normalise(m)
        q = Signal(signed(nx.FP16_EXP_BITS + 3), name="s1_q")
        m.d.comb += q.eq(s1["e"] - nx.FP16_BIAS)
        table = self._memory(m, "rsqrt", 16)
        rd = table.read_port()
        m.d.comb += rd.addr.eq(Cat(s1["man"], q[0]))
        s2 = stage(m, "s2", adjust=-(q >> 1), invalid=s1["nan"] | (s1["sign"] & ~s1["zero"]),
                   **{key: s1[key] for key in ("sign", "zero", "inf")})

        with m.If(s2["invalid"]):
            m.d.sync += self.o.eq(nx.FP16_CANONICAL_NAN)
        with m.Elif(s2["zero"]):
            m.d.sync += self.o.eq(Cat(Const(FP16_INF, 15), s2["sign"]))
        with m.Elif(s2["inf"]):
            m.d.sync += self.o.eq(0)
        with m.Else():  # table values are in (0.5, 1] and results normal: the exponent field stays in 7 ... 27
            m.d.sync += self.o.eq(rd.data + (s2["adjust"] << nx.FP16_MAN_BITS)[:16])

    # --- gelu: piecewise linear in the pattern, segment sizes per region ----------------------

    def _elaborate_gelu(self, m: Module):
        x = self.i.as_value()
        low = nx.GELU_MAX_FRAC_BITS
        region = self._memory(m, "region", nx.FP16_MAN_BITS + 4)
        cfg = region.read_port(domain="comb")
        m.d.comb += cfg.addr.eq(x[low:])
        offset, frac_bits = cfg.data[:nx.FP16_MAN_BITS], cfg.data[nx.FP16_MAN_BITS:]
        mask = Signal(low, name="s1_mask")
        m.d.comb += mask.eq((C(1, low + 1) << frac_bits) - 1)
        special = self.i.exp == FP16_EXP_MAX
        s1 = stage(m, "s1", segment=(offset + (x[:low] >> frac_bits))[:nx.FP16_MAN_BITS],
                   frac=x[:low] & mask, sign=self.i.sign, inf=special & (self.i.mant == 0),
                   nan=special & (self.i.mant != 0))

        table = self._memory(m, "segment", sum(GELU_FIELDS.values()))
        rd = table.read_port()
        m.d.comb += rd.addr.eq(s1["segment"])
        flags = ("sign", "inf", "nan")
        s2 = stage(m, "s2", frac=s1["frac"], **{key: s1[key] for key in flags})

        fields, at = {}, 0
        for key, width in GELU_FIELDS.items():
            fields[key], at = rd.data[at:at + width], at + width
        s3 = stage(m, "s3", product=fields["slope"].as_signed() * Cat(s2["frac"], C(0, 1)).as_signed(),
                   base=fields["base"], exp=fields["exp"], **{key: s2[key] for key in flags})

        magnitude = Signal(nx.GELU_SIGNIFICAND_BITS + 1, name="s4_magnitude")
        m.d.comb += magnitude.eq(s3["base"] + (s3["product"] >> nx.GELU_SLOPE_GUARD_BITS))
        s4 = stage(m, "s4", magnitude=magnitude, exp=s3["exp"], **{key: s3[key] for key in flags})

        # magnitude * 2**exp as FP32: normalise by the leading zeros (exact: at most 24 bits)
        lz = leading_zeros(m, s4["magnitude"], name="s5_lz")
        norm = Signal(nx.GELU_SIGNIFICAND_BITS + 1, name="s5_norm")
        m.d.comb += norm.eq(s4["magnitude"] << lz)
        value = Signal(FP32, name="value")
        with m.If(s4["nan"]):
            m.d.sync += value.eq(nx.FP32_CANONICAL_NAN)
        with m.Elif(s4["inf"]):  # gelu(+Inf) = +Inf, gelu(-Inf) = -0
            m.d.sync += value.eq(Mux(s4["sign"], 1 << 31, FP32_INF))
        with m.Elif(s4["magnitude"] == 0):
            m.d.sync += value.eq(Cat(Const(0, 31), s4["sign"]))
        with m.Else():  # the exponent field stays within 64 ... 143
            m.d.sync += value.eq(Cat(norm[:nx.FP32_MAN_BITS], (s4["exp"] - lz)[:nx.FP32_EXP_BITS], s4["sign"]))
        m.submodules.to_fp16 = conv = ToFP16Core()
        m.d.comb += [conv.i.eq(value), self.o.eq(conv.o)]


class SpecialFunction(Streamed):
    """Stream special-function unit for `name` (exp, recip, rsqrt or gelu): payload FP16 ->
    special(name, x) (FP16); latency core + 1 cycles (the FIFO): exp 8, recip 6, rsqrt 4,
    gelu 8; one result per cycle."""

    def __init__(self, name: str):
        super().__init__(SpecialFunctionCore(name))
        self.name = name
