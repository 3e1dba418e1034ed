"""MAC tree: one matrix-unit lane. `width` exact FP16 products reduced by the folding FP32 adder
tree (`numerics.fold_tree` of `numerics.mul_fp16_exact`): level by level, lane j is added to lane
j + n/2 while n lanes remain."""
from amaranth.hdl import Module
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .common import FP16, FP32, check_power_of_two
from .fp16_mul import FP16MulCore
from .fp32_add import FP32AddCore
from .stream import Streamed


def mac_operands(width: int) -> data.StructLayout:
    """Payload of a MAC tree: the input vector x and the weight vector w, `width` FP16 each."""
    return data.StructLayout({"x": data.ArrayLayout(FP16, width), "w": data.ArrayLayout(FP16, width)})


class MacTreeCore(wiring.Component):
    """Free-running MAC tree: `o` = fold_tree(mul_fp16_exact(i.x, i.w)), FP32.

    `latency` = FP16MulCore.latency + log2(width) * FP32AddCore.latency = 2 + 5 * log2(width)
    cycles; `width` multipliers and width - 1 adders, one dot product of `width` terms per cycle.
    """

    def __init__(self, width: int):
        check_power_of_two("MAC tree", width)
        self.width = width
        self.levels = width.bit_length() - 1
        self.latency = FP16MulCore.latency + self.levels * FP32AddCore.latency
        super().__init__({"i": In(mac_operands(width)), "o": Out(FP32)})

    def elaborate(self, platform):
        m = Module()
        lanes = []
        for j in range(self.width):
            mul = m.submodules[f"mul{j}"] = FP16MulCore()
            m.d.comb += [mul.i.a.eq(self.i.x[j]), mul.i.b.eq(self.i.w[j])]
            lanes.append(mul.o)
        for level in range(self.levels):
            half = len(lanes) // 2
            sums = []
            for j in range(half):
                add = m.submodules[f"add{level}_{j}"] = FP32AddCore()
                m.d.comb += [add.i.a.eq(lanes[j]), add.i.b.eq(lanes[j + half])]
                sums.append(add.o)
            lanes = sums
        m.d.comb += self.o.eq(lanes[0])
        return m


class MacTree(Streamed):
    """Stream MAC tree: payload {x, w} (`width` FP16 each) -> fold_tree of the exact products
    (FP32); latency 3 + 5 * log2(width) cycles (core + FIFO 1), one dot product per cycle."""

    def __init__(self, width: int):
        super().__init__(MacTreeCore(width))
        self.width = width
