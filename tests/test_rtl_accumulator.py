"""TileAccumulator RTL against numerics.add_in_order on Verilator and Icarus."""
import pytest

from ringgpt.hw.arith.accumulator import TileAccumulator
from ringgpt.sim.cocotb_support.runner import Design

CONTEXTS = 6
SUMS = {"verilator": 8_000, "icarus": 2_000}


@pytest.mark.parametrize("contexts", [0, -1, 2.5, True, "4"])
def test_rejects_bad_context_count(contexts):
    with pytest.raises(ValueError, match=rf"^accumulator contexts must be an int >= 1, got {contexts!r}$"):
        TileAccumulator(contexts)


@pytest.mark.rtl
def test_accumulator_bit_exact(run_tb, sim):
    run_tb(Design.of("ringgpt.hw.arith.accumulator:TileAccumulator", contexts=CONTEXTS),
           "ringgpt.sim.tb.tb_accumulator", seed=7, vectors=SUMS[sim])
