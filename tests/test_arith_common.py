"""hw/arith/common.py: the leading-zero count's tree (and the trailing-zero count made of it) (used by every normalising unit: the MAC tree, the FP32 adder and
multiplier, the FP16 multiplier, the special functions) equals width - bit_length at every width those units use and
around, simulated in Amaranth: every value up to 10 bits, and above that every leading-one position with random bits
below it, and zero."""
import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from ringgpt.hw.arith.common import leading_zeros, trailing_zeros


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 7, 8, 9, 10, 16, 22, 24, 25, 27, 32, 35, 41, 48, 50, 64])
def test_leading_zeros_counts_to_the_highest_set_bit(width):
    m = Module()
    value = Signal(width)
    count = leading_zeros(m, value, name="lz")
    assert len(count) == width.bit_length()
    rng = random.Random(width)
    if width <= 10:
        values = range(1 << width)
    else:
        values = [0, (1 << width) - 1] + [(1 << top) | rng.getrandbits(top) if top else 1
                                           for top in range(width) for _ in range(8)]
    wrong = []

    async def bench(ctx):
        for v in values:
            ctx.set(value, v)
            if ctx.get(count) != width - v.bit_length():
                wrong.append(v)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert wrong == [], f"{len(wrong)} values counted wrongly at width {width}, first {wrong[:3]}"


@pytest.mark.parametrize("width", [1, 5, 24, 35])
def test_trailing_zeros_count_to_the_lowest_set_bit(width):
    m = Module()
    value = Signal(width)
    count = trailing_zeros(m, value, name="tz")
    rng = random.Random(width)
    values = [0, (1 << width) - 1] + [rng.getrandbits(width) << low & ((1 << width) - 1) | 1 << low
                                       for low in range(width) for _ in range(4)]
    wrong = []

    async def bench(ctx):
        for v in values:
            ctx.set(value, v)
            if ctx.get(count) != ((v & -v).bit_length() - 1 if v else width):
                wrong.append(v)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert wrong == [], f"{len(wrong)} values counted wrongly at width {width}, first {wrong[:3]}"
