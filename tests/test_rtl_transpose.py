"""hw/core/transpose.py: the transpose tile in Amaranth's simulator (seconds) against a word array: random row
writes at random column offsets with random masks (words past the last column dropped), every column read back
after each write."""
from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from ringgpt.hw.core.transpose import TransposeTile


@pytest.mark.parametrize("size", [2, 8, 16])
def test_columns_read_back_what_rows_wrote(size):
    rng = np.random.default_rng(size)
    dut = TransposeTile(size)
    want = np.zeros((size, size), np.int64)

    async def testbench(ctx):
        for step in range(6 * size):
            row, col = int(rng.integers(size)), int(rng.integers(size)) if step % 3 else 0
            words = rng.integers(0, 1 << 16, size)
            mask = rng.integers(0, 2, size) if step % 4 else np.ones(size, np.int64)
            ctx.set(dut.write_en, 1)
            ctx.set(dut.write_row, row)
            ctx.set(dut.write_col, col)
            ctx.set(dut.write_mask, int(sum(int(b) << k for k, b in enumerate(mask))))
            for k in range(size):
                ctx.set(dut.write_data[k], int(words[k]))
            await ctx.tick()
            ctx.set(dut.write_en, 0)
            for k in range(size):
                if mask[k] and col + k < size:
                    want[row, col + k] = words[k]
            for c in range(size):
                ctx.set(dut.read_col, c)
                got = [ctx.get(dut.read_data[i]) for i in range(size)]
                assert got == want[:, c].tolist(), (step, c)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()


def test_size_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        TransposeTile(6)
