"""The DMA unit's transpose tile: P x P FP16 words written a row at a time, read a column at a time.

    write (row i, words at columns col + k) ──rotate by col + i──▶ P memories of P words (LUT RAM):
                                                                  element (i, c) in memory (c + i) mod P, word i
    read column j: memory b at word (b - j) mod P ──rotate back by j──▶ the column, row 0 first

Skewing the elements over the memories gives each memory one element of every row and one of every column, so
a row is written and a column read in one cycle through one write and one read port per memory, without a
register per element (a tile of registers that shifts its columns out is P x P x 16 flip-flops, each behind a
choice between fill and shift: 65,536 LUTs and as many flip-flops at u280, against the memories and two
rotations here).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from .interfaces import WORD


def rotated(value, amount, count: int, width: int = WORD) -> Value:
    """The `count` fields of `width` bits of `value` rotated towards higher positions by `amount` (< count): field
    k lands in position (k + amount) mod count. One 2:1 choice a bit and amount bit."""
    value = Value.cast(value)
    bits = count * width
    for bit in range(len(Value.cast(amount))):
        step = ((1 << bit) % count) * width
        if step:
            value = Mux(amount[bit], Cat(value[bits - step:], value[:bits - step]), value)
    return value


class TransposeTile(wiring.Component):
    """A `size` x `size` tile of FP16 words. Write (`write_en`): row `write_row` takes word k of `write_data` at
    column `write_col` + k where `write_mask`[k] is set and that column is inside the tile (the others keep
    their words). Read: `read_data`[i] is the word at row i, column `read_col`, combinationally (a write shows
    from the next cycle). Throughput: one row written and one column read per cycle."""

    def __init__(self, size: int):
        if size < 1 or size & (size - 1):
            raise ValueError(f"the transpose tile's size must be a power of two, got {size}")
        self.size = size
        words = data.ArrayLayout(WORD, size)
        super().__init__({"write_en": In(1), "write_row": In(range(size)), "write_col": In(range(size)),
                          "write_data": In(words), "write_mask": In(size),
                          "read_col": In(range(size)), "read_data": Out(words)})

    def elaborate(self, platform):
        m = Module()
        P = self.size
        inside = Signal(P)       # the words that land inside the tile, and are meant to
        m.d.comb += [inside[k].eq(self.write_mask[k] & (self.write_col + k < P)) for k in range(P)]
        skew = Signal(range(P))
        m.d.comb += skew.eq(self.write_col + self.write_row)
        spread, enables = Signal(P * WORD), Signal(P)
        m.d.comb += [spread.eq(rotated(self.write_data.as_value(), skew, P)),
                     enables.eq(rotated(inside, skew, P, 1))]
        column = Signal(P * WORD)
        for b in range(P):
            mem = memory.Memory(shape=WORD, depth=P, init=[])
            m.submodules[f"mem{b}"] = mem
            wp, rp = mem.write_port(), mem.read_port(domain="comb")
            m.d.comb += [wp.addr.eq(self.write_row), wp.data.eq(spread[b * WORD:(b + 1) * WORD]),
                         wp.en.eq(self.write_en & enables[b]),
                         rp.addr.eq(b - self.read_col), column[b * WORD:(b + 1) * WORD].eq(rp.data)]
        # row i's word is in memory (i + read_col) mod P: rotate down by read_col, i.e. up by P - read_col
        back = Signal(range(P))
        m.d.comb += back.eq(-self.read_col)
        m.d.comb += self.read_data.eq(rotated(column, back, P))
        return m
