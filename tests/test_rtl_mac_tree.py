"""MacTree RTL against numerics.tile_sums on Verilator and Icarus."""
import pytest

from ringgpt.hw.arith.mac_tree import MacTree
from ringgpt.hw.config import get_config
from ringgpt.sim.cocotb_support.runner import Design

WIDTH = get_config("sim-small").mac_width
ROWS = {"verilator": 20_000, "icarus": 3_000}


@pytest.mark.parametrize("width", [0, 1, 3, 12, -4, 8.0, True, "8"])
def test_rejects_width_not_a_power_of_two(width):
    with pytest.raises(ValueError, match=rf"^MAC tree width must be a power of two >= 2, got {width!r}$"):
        MacTree(width)


@pytest.mark.parametrize("width, latency", [(2, 8), (4, 8), (8, 10), (16, 10), (64, 12), (128, 14)])
def test_latency_is_split_two_trees_normalise_round_plus_fifo(width, latency):
    """1 (split) + 2 x ceil(log2(width) / 2) (max tree, adder tree) + 4 (align, count, normalise, round) + 1 (FIFO)."""
    assert MacTree(width).latency == latency


@pytest.mark.rtl
def test_mac_tree_bit_exact(run_tb, sim):
    run_tb(Design.of("ringgpt.hw.arith.mac_tree:MacTree", width=WIDTH), "ringgpt.sim.tb.tb_mac_tree",
           seed=5, vectors=ROWS[sim])
