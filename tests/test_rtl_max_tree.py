"""MaxTree RTL against numerics.reduce_max on Verilator and Icarus."""
import pytest

from ringgpt.hw.arith.max_tree import MaxTree
from ringgpt.hw.config import get_config
from ringgpt.sim.cocotb_support.runner import Design

WIDTH = get_config("sim-small").vector_width
ROWS = {"verilator": 40_000, "icarus": 6_000}


@pytest.mark.parametrize("width", [0, 1, 6, 2.0, False, None])
def test_rejects_width_not_a_power_of_two(width):
    with pytest.raises(ValueError, match=rf"^max tree width must be a power of two >= 2, got {width!r}$"):
        MaxTree(width)


@pytest.mark.rtl
def test_max_tree_bit_exact(run_tb, sim):
    run_tb(Design.of("ringgpt.hw.arith.max_tree:MaxTree", width=WIDTH), "ringgpt.sim.tb.tb_max_tree",
           seed=6, vectors=ROWS[sim])
