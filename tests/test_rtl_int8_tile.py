"""Int8Tile RTL (hw/arith/int8_tile.py) against numerics.int8_tile_sums: in Amaranth's simulator at sim-small's INT8
tile (16 weights) and at u280's (128) in the default suite, and as a stream under back-pressure on Verilator and Icarus (-m slow: not yet
part of a unit the core builds, so CI's budget goes to the units that are)."""
import numpy as np
import pytest

from ringgpt.hw import numerics as nx
from ringgpt.hw.arith.int8_tile import Int8LaneCore, Int8Tile, Int8TileCore
from ringgpt.hw.config import get_config
from ringgpt.sim.cocotb_support.runner import Design
from ringgpt.sim.tb.tb_int8_tile import case

from free_running import outputs

WIDTH = nx.INT8_TILE_ROWS * get_config("sim-small").mac_width
U280_WIDTH = nx.INT8_TILE_ROWS * get_config("u280").mac_width
ROWS = {"verilator": 20_000, "icarus": 3_000}


@pytest.mark.parametrize("width", [0, 1, 3, 12, 8.0, True])
def test_rejects_width_not_a_power_of_two(width):
    with pytest.raises(ValueError, match=rf"^INT8 tile width must be a power of two >= 2, got {width!r}$"):
        Int8TileCore(width)


@pytest.mark.parametrize("width, latency", [(2, 9), (16, 11), (128, 15)])
def test_latency_is_two_trees_and_six_stages_plus_fifo(width, latency):
    """1 (split) + 2 x ceil(log2(width) / 2) (exponent maximum, adder tree) + 5 (align, multiply, sum, normalise,
    round) + 1 (FIFO)."""
    assert Int8Tile(width).latency == latency


def test_a_lane_alone_is_the_tile_less_its_aligner():
    """Int8LaneCore (what each matrix-unit lane keeps): the products, the adder tree and 3 stages after it."""
    assert [Int8LaneCore(w).latency for w in (2, 16, 128)] == [5, 6, 8]


@pytest.mark.parametrize("width, rows", [(WIDTH, 600), (U280_WIDTH, 60)])
def test_int8_tile_bit_exact_in_amaranth_simulation(width, rows):
    """The testbench's vectors (every kind: spread exponents, specials, signed zeros, Inf x 0, cancellation) through
    the free-running core, one a cycle, at sim-small's tile and at u280's (128 weights)."""
    vectors, _, expected = case(3, rows, width)
    dut = Int8TileCore(width)

    def feed(ctx, n):
        x, q = vectors[n]
        for j in range(width):
            ctx.set(dut.i.x[j].as_value(), x[j])
            ctx.set(dut.i.q[j], q[j])
    got = outputs(dut, feed, len(vectors))
    assert np.array_equal(got, expected), f"{int((got != expected).sum())} tiles differ, first {np.argmax(got != expected)}"


@pytest.mark.rtl
@pytest.mark.slow
def test_int8_tile_bit_exact(run_tb, sim):
    run_tb(Design.of("ringgpt.hw.arith.int8_tile:Int8Tile", width=WIDTH), "ringgpt.sim.tb.tb_int8_tile",
           seed=5, vectors=ROWS[sim])
