"""SpecialFunction RTL (exp, recip, rsqrt, gelu) against numerics.special on Verilator and Icarus,
exhaustively over all 65,536 FP16 inputs."""
import pytest

from ringgpt.hw import numerics as nx
from ringgpt.hw.arith.accuracy import special_accuracy
from ringgpt.hw.arith.special import SpecialFunction
from ringgpt.sim.cocotb_support.runner import Design


def test_rejects_unknown_function():
    with pytest.raises(ValueError, match=r"^unknown special function 'tanh'; known: \['exp', 'gelu', 'recip', 'rsqrt'\]$"):
        SpecialFunction("tanh")


def test_tables_come_from_numerics():
    unit = SpecialFunction("rsqrt")
    base, slope = nx.lut_tables("rsqrt")
    assert unit.core.base_init == nx.fp32_bits(base).tolist()
    assert unit.core.slope_init == nx.fp32_bits(slope).tolist()
    assert len(unit.core.base_init) == nx.LUT_SEGMENTS


@pytest.mark.parametrize("name, lo, hi", [("recip", 1e-4, 1e4), ("rsqrt", 1e-4, 1e4), ("exp", -1.0, 1.0)])
def test_within_one_ulp_where_the_model_needs_it(name, lo, hi):
    stats = special_accuracy(name, lo, hi)
    assert stats["max_ulp"] <= 1.0 and stats["within_1ulp_pct"] == 100.0, stats


@pytest.mark.rtl
@pytest.mark.parametrize("name", sorted(nx.SPECIAL_FUNCTIONS))
def test_special_function_exhaustive(run_tb, sim, name):
    run_tb(Design.of("ringgpt.hw.arith.special:SpecialFunction", name=name), "ringgpt.sim.tb.tb_special", seed=8)
