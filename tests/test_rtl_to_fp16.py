"""ToFP16 RTL against numerics.to_fp16 on Verilator and Icarus: all FP16 values plus dense random
FP32, rounding ties, overflow boundary and subnormal outputs."""
import pytest

from ringgpt.sim.cocotb_support.runner import Design

VECTORS = {"verilator": 30_000, "icarus": 6_000}


@pytest.mark.rtl
def test_to_fp16_bit_exact(run_tb, sim):
    run_tb(Design.of("ringgpt.hw.arith.to_fp16:ToFP16"), "ringgpt.sim.tb.tb_to_fp16",
           seed=4, vectors=VECTORS[sim])
