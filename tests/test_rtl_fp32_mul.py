"""FP32IntMultiplier RTL against numerics.mul_fp32 on Verilator and Icarus."""
import pytest

from ringgpt.hw.arith.fp32_mul import FP32IntMultiplier
from ringgpt.sim.cocotb_support.runner import Design

VECTORS = {"verilator": 40_000, "icarus": 8_000}


@pytest.mark.parametrize("int_bits", [0, 25, 2.0, True])
def test_rejects_bad_factor_width(int_bits):
    with pytest.raises(ValueError, match=rf"^integer factor width must be an int from 1 to 24, got {int_bits!r}$"):
        FP32IntMultiplier(int_bits)


@pytest.mark.rtl
def test_fp32_int_multiplier_bit_exact(run_tb, sim):
    run_tb(Design.of("ringgpt.hw.arith.fp32_mul:FP32IntMultiplier", int_bits=5), "ringgpt.sim.tb.tb_fp32_mul",
           seed=3, vectors=VECTORS[sim])
