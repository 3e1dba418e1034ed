"""SpecialFunction RTL (exp, recip, rsqrt, gelu) against numerics.special on Verilator and Icarus,
exhaustively over all 65,536 FP16 inputs."""
import numpy as np
import pytest

from ringgpt.hw import numerics as nx
from ringgpt.hw.arith.special import GELU_FIELDS, LATENCY, SpecialFunction
from ringgpt.sim.cocotb_support.runner import Design


def test_rejects_unknown_function():
    with pytest.raises(ValueError, match=r"^unknown special function 'tanh'; known: \['exp', 'gelu', 'recip', 'rsqrt'\]$"):
        SpecialFunction("tanh")


@pytest.mark.parametrize("name", sorted(nx.SPECIAL_FUNCTIONS))
def test_tables_come_from_numerics(name):
    unit = SpecialFunction(name)
    tables = nx.lut_tables(name)
    if name == "gelu":
        assert unit.core.tables["region"] == (tables["offset"] | tables["frac_bits"] << nx.FP16_MAN_BITS).tolist()
        width = GELU_FIELDS["base"]
        for entry, b, d, e in zip(unit.core.tables["segment"], tables["base"], tables["slope"], tables["exp"]):
            slope = (entry >> width) & ((1 << width) - 1)
            assert (entry & ((1 << width) - 1), slope - ((slope >> (width - 1)) << width), entry >> (2 * width)) \
                == (b, d, e + nx.FP32_BIAS + nx.GELU_SIGNIFICAND_BITS)
    else:
        for key, table in tables.items():
            bits = {np.float16: nx.fp16_bits, np.float32: nx.fp32_bits}.get(table.dtype.type, np.asarray)(table)
            assert unit.core.tables[key] == bits.tolist(), key
    assert unit.latency == LATENCY[name] + 1


def test_table_sizes():
    """What the units hold: exp 64 x (24 + 18) bits, recip 1024 x 32, rsqrt 2048 x 16, gelu a
    256 x 14-bit region ROM and 1024 x 56-bit segments, of which 866 are used."""
    sizes = {name: {key: (len(table), max(table).bit_length()) for key, table in SpecialFunction(name).core.tables.items()}
             for name in nx.SPECIAL_FUNCTIONS}
    assert sizes == {"exp": {"base": (64, 24), "slope": (64, 18)}, "recip": {"recip": (1024, 30)},
                     "rsqrt": {"rsqrt": (2048, 14)}, "gelu": {"region": (256, 14), "segment": (1024, 56)}}
    gelu = nx.lut_tables("gelu")
    assert max(gelu["offset"] + (1 << (nx.GELU_MAX_FRAC_BITS - gelu["frac_bits"]))) == 866


@pytest.mark.rtl
@pytest.mark.parametrize("name", sorted(nx.SPECIAL_FUNCTIONS))
def test_special_function_exhaustive(run_tb, sim, name):
    run_tb(Design.of("ringgpt.hw.arith.special:SpecialFunction", name=name), "ringgpt.sim.tb.tb_special", seed=8)
