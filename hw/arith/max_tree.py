"""Max tree over FP16 under the total order of `numerics.reduce_max`:
-NaN < -Inf < ... < -0 < +0 < ... < +Inf < +NaN. The winner's bit pattern is passed through
unchanged (the order is total on patterns, so the result does not depend on the tree shape)."""
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .common import FP16, check_power_of_two, register
from .stream import Streamed


def order_key(m: Module, x, *, name: str) -> Signal:
    """Unsigned key of an FP16 pattern whose integer order is the total order (sign bit flipped
    for positive patterns, all bits inverted for negative ones)."""
    key = Signal(16, name=name)
    bits = x.as_value()
    m.d.comb += key.eq(Mux(x.sign, ~bits, Cat(bits[:15], ~bits[15])))
    return key


def max_tree_latency(width: int) -> int:
    """Cycles of MaxTreeCore(width): one registered comparison level per halving."""
    return width.bit_length() - 1


class MaxTreeCore(wiring.Component):
    """Free-running max tree: `o` = reduce_max(i) over `width` FP16 lanes, `latency` = log2(width)
    cycles (one registered comparison level per cycle)."""

    def __init__(self, width: int):
        check_power_of_two("max tree", width)
        self.width = width
        self.latency = max_tree_latency(width)
        super().__init__({"i": In(data.ArrayLayout(FP16, width)), "o": Out(FP16)})

    def elaborate(self, platform):
        m = Module()
        lanes = [self.i[j] for j in range(self.width)]
        for level in range(self.latency):
            half = len(lanes) // 2
            winners = []
            for j in range(half):
                a, b = lanes[j], lanes[j + half]
                greater = order_key(m, b, name=f"key{level}_{j}_b") > order_key(m, a, name=f"key{level}_{j}_a")
                winners.append(register(m, Mux(greater, b, a), FP16, name=f"max{level}_{j}"))
            lanes = winners
        m.d.comb += self.o.eq(lanes[0])
        return m


class MaxTree(Streamed):
    """Stream max tree: payload `width` FP16 lanes -> their total-order maximum (FP16); latency
    log2(width) + 1 cycles (core + FIFO 1), one result per cycle."""

    def __init__(self, width: int):
        super().__init__(MaxTreeCore(width))
        self.width = width
