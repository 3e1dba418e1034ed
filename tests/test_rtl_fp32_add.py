"""FP32Adder RTL against numerics.add_fp32 on Verilator and Icarus."""
import pytest

from ringgpt.sim.cocotb_support.runner import Design

VECTORS = {"verilator": 60_000, "icarus": 10_000}


@pytest.mark.rtl
def test_fp32_adder_bit_exact(run_tb, sim):
    run_tb(Design.of("ringgpt.hw.arith.fp32_add:FP32Adder"), "ringgpt.sim.tb.tb_fp32_add",
           seed=1, vectors=VECTORS[sim])
