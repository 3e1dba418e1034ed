"""FP16Multiplier RTL against numerics.mul_fp16_exact on Verilator and Icarus."""
import pytest

from ringgpt.sim.cocotb_support.runner import Design

VECTORS = {"verilator": 60_000, "icarus": 10_000}


@pytest.mark.rtl
def test_fp16_multiplier_bit_exact(run_tb, sim):
    run_tb(Design.of("ringgpt.hw.arith.fp16_mul:FP16Multiplier"), "ringgpt.sim.tb.tb_fp16_mul",
           seed=2, vectors=VECTORS[sim])
