"""The on-chip buffers: ABUF (activations) and WBUF (weights, two banks), as `amaranth.lib.memory.Memory`.

Each buffer is *word-interleaved* over `banks` memories (word a lives in memory a mod banks, row
a // banks), so a port reads or writes up to `banks` consecutive words at any word address in one
cycle: every memory sees one row, and the words are rotated into place (`InterleavedBuffer`). WBUF
is split into two segments (its two banks: the DMA fills one while the matrix unit reads the other),
each its own set of memories. Ports are named by what they carry (`abuf_x`, `wbuf_w0`, ...); every
port is a separate memory port, and `WriteArbiter` shares one write port between two clients.
Reads return data READ_LATENCY = 1 cycle after the address; writes past the buffer's end are dropped.
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import Space

from .interfaces import WORD, ReadPort, WritePort

WBUF_BANKS = 2
"""WBUF's banks (segments of the address space, each its own memories)."""


def _log2(value: int) -> int:
    return value.bit_length() - 1


def _pow2_at_least(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


class InterleavedBuffer(wiring.Component):
    """`words` FP16 words over `segments` x `banks` memories, with the read and write ports named in
    `reads` / `writes` (name -> width in words, each <= banks). A read port returns buffer[addr + i]
    for i < width one cycle after `addr`; a write port writes data[i] to addr + i where en and mask[i]
    (and addr + i < words). Throughput: one access per port per cycle."""

    def __init__(self, words: int, *, banks: int, segments: int = 1, reads: dict, writes: dict):
        if banks < 1 or banks & (banks - 1):
            raise ValueError(f"banks must be a power of two, got {banks}")
        if words % (banks * segments):
            raise ValueError(f"{words} words do not split into {segments} x {banks} memories")
        wide = [w for w in list(reads.values()) + list(writes.values()) if w > banks]
        if wide:
            raise ValueError(f"ports of {wide} words are wider than the {banks} banks")
        self.words, self.banks, self.segments = words, banks, segments
        self.rows = words // (banks * segments)
        self.reads, self.writes = dict(reads), dict(writes)
        super().__init__({**{name: In(ReadPort(w)) for name, w in reads.items()},
                          **{name: In(WritePort(w)) for name, w in writes.items()}})

    def _place(self, m: Module, addr, bank: int, *, name: str):
        """For memory column `bank`: which word i of an access at `addr` lands there, and its
        (segment, row) within the segment."""
        lb = _log2(self.banks)
        index = Signal(max(lb, 1), name=f"{name}_i")
        m.d.comb += index.eq((bank - addr[:lb]) & (self.banks - 1) if lb else 0)
        word = Signal(len(addr) + 1, name=f"{name}_word")
        m.d.comb += word.eq(addr + index)
        row = word >> lb
        segment = Signal(range(self.segments), name=f"{name}_seg")
        local = Signal(range(max(2, self.rows)), name=f"{name}_row")
        m.d.comb += local.eq(row)
        for s in range(1, self.segments):
            with m.If(row >= s * self.rows):
                m.d.comb += [segment.eq(s), local.eq(row - s * self.rows)]
        return index, word, segment, local

    def elaborate(self, platform):
        m = Module()
        mems = [[memory.Memory(shape=WORD, depth=self.rows, init=[]) for _ in range(self.banks)]
                for _ in range(self.segments)]
        for s, column in enumerate(mems):
            for b, mem in enumerate(column):
                m.submodules[f"mem{s}_{b}"] = mem
        lb = _log2(self.banks)
        for name, width in self.reads.items():
            port = getattr(self, name)
            bank_data = Signal(data.ArrayLayout(WORD, self.banks), name=f"{name}_banks")
            for b in range(self.banks):
                _, _, segment, local = self._place(m, port.addr, b, name=f"{name}_b{b}")
                segment_d = Signal.like(segment, name=f"{name}_b{b}_seg_d")
                m.d.sync += segment_d.eq(segment)
                value = 0
                for s in range(self.segments):
                    rd = mems[s][b].read_port()
                    m.d.comb += rd.addr.eq(local)
                    value = rd.data if s == 0 else Mux(segment_d == s, rd.data, value)
                m.d.comb += bank_data[b].eq(value)
            low_d = Signal(max(lb, 1), name=f"{name}_low_d")
            m.d.sync += low_d.eq(port.addr[:lb] if lb else 0)
            for i in range(width):
                m.d.comb += port.data[i].eq(bank_data[(low_d + i)[:lb]] if lb else bank_data[0])
        for name, width in self.writes.items():
            port = getattr(self, name)
            for b in range(self.banks):
                index, word, segment, local = self._place(m, port.addr, b, name=f"{name}_b{b}")
                active = port.en & (index < width) & port.mask.bit_select(index, 1) & (word < self.words)
                for s in range(self.segments):
                    wp = mems[s][b].write_port()
                    m.d.comb += [wp.addr.eq(local), wp.data.eq(port.data[index]),
                                 wp.en.eq(active & (segment == s))]
        return m


class WriteArbiter(wiring.Component):
    """Two clients of one write port: `first` wins whenever it writes, else `second` is passed through."""

    def __init__(self, words: int):
        self.words = words
        super().__init__({"first": In(WritePort(words)), "second": In(WritePort(words)),
                          "out": wiring.Out(WritePort(words))})

    def elaborate(self, platform):
        # Muxes, not an If: Icarus never evaluates an `always @*` whose inputs keep their initial values
        # (a client that is a register never written yet), leaving its outputs X
        m = Module()
        first, second = self.first, self.second
        m.d.comb += [self.out.addr.eq(Mux(first.en, first.addr, second.addr)),
                     self.out.data.eq(Mux(first.en, first.data.as_value(), second.data.as_value())),
                     self.out.mask.eq(Mux(first.en, first.mask, second.mask)),
                     self.out.en.eq(first.en | second.en)]
        return m


def buffer_banks(cfg: ArchConfig, space: Space, ports: dict) -> int:
    """Interleave factor of a buffer: the widest port it must serve, and at least the config's
    lane widths (mac_width, vector_width for ABUF; mac_width for WBUF)."""
    widths = [sig.words for sp, sig in ports.values() if sp == space]
    lanes = [cfg.mac_width, cfg.mpu_lanes] + ([cfg.vector_width] if space == Space.ABUF else [])
    return _pow2_at_least(max(widths + lanes))


class Buffers(wiring.Component):
    """ABUF (`abuf_words`) and WBUF (`wbuf_words`, two banks), sized from `cfg`, with the ports in
    `ports`: member name -> (Space.ABUF or Space.WBUF, ReadPort(w) or WritePort(w)), each member
    facing the unit that drives it. Write ports listed later take precedence on the same word."""

    def __init__(self, cfg: ArchConfig, ports: dict):
        self.cfg = cfg
        self.ports = dict(ports)
        for name, (space, sig) in self.ports.items():
            if space not in (Space.ABUF, Space.WBUF) or not isinstance(sig, (ReadPort, WritePort)):
                raise ValueError(f"buffer port {name!r}: {space} {sig!r} is not an ABUF/WBUF read or write port")
        self.banks = {space: buffer_banks(cfg, space, self.ports) for space in (Space.ABUF, Space.WBUF)}
        super().__init__({name: In(sig) for name, (space, sig) in self.ports.items()})

    def elaborate(self, platform):
        m = Module()
        for space, words, segments in ((Space.ABUF, self.cfg.abuf_words, 1),
                                       (Space.WBUF, self.cfg.wbuf_words, WBUF_BANKS)):
            mine = {name: sig for name, (sp, sig) in self.ports.items() if sp == space}
            buf = InterleavedBuffer(words, banks=self.banks[space], segments=segments,
                                    reads={n: s.words for n, s in mine.items() if isinstance(s, ReadPort)},
                                    writes={n: s.words for n, s in mine.items() if isinstance(s, WritePort)})
            m.submodules[space.name.lower()] = buf
            for name in mine:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(buf, name))
        return m
