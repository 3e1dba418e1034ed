"""A free-running arithmetic core in Amaranth's simulator: one input a cycle, each output `latency` cycles later."""
import numpy as np
from amaranth.sim import Simulator


def outputs(dut, feed, count: int) -> np.ndarray:
    """The `count` values of `dut.o` (uint32) for inputs 0 .. count - 1, `feed(ctx, n)` setting input n in its cycle."""
    got = []

    async def bench(ctx):
        for n in range(count + dut.latency):
            if n < count:
                feed(ctx, n)
            await ctx.tick()
            if n + 1 >= dut.latency:
                got.append(ctx.get(dut.o.as_value()))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return np.array(got[:count], np.uint32)
