"""The on-chip buffers: ABUF (activations) and WBUF (weights), as `amaranth.lib.memory.Memory`.

Each buffer is *chunk-banked*: its words are cut into chunks of `chunk` words, and chunk c is row
c div banks of memory c mod banks, a memory of `chunk`-word rows with one write enable per word. A port
of up to `chunk` words at any word address touches at most two consecutive chunks, which lie in two
different memories, so it completes in one cycle: the two rows are read (or written with their word
enables) and the words are shifted into place (`BankedBuffer`). Wide rows are what an FPGA's block
memories hold densely (a URAM is 4,096 rows of 72 bits).

`banks` is the smallest prime above mpu_lanes (17 at u280; `buffer_geometry`): the matrix unit's lanes
read weight tiles `src2_stride` words apart, and lane l's chunk c0 + l * stride / chunk falls in a bank
of its own for every stride that is not a multiple of banks chunks. With a power of two (16 banks) the
compiled GPT-2 programs' strides (768, 1,024, 1,600, ... words) put many lanes in one bank:
`scripts/bank_conflicts.py` counts 1.9 to 15.9 times the matrix unit's cycles in conflicts for 16 banks,
none for 17 (docs/rtl-core.md, "Resources"). Today every port is still a memory port of its own; the
lanes' shared port per bank is the next step.

WBUF's two banks are the halves of its address space (the DMA fills one while the matrix unit reads the
other); every port is a memory port of its own, so the halves need no memories of their own. Ports are
named by what they carry (`abuf_x`, `wbuf_w0`, ...); `WriteArbiter` shares one write port between two
clients. Reads return data READ_LATENCY = 1 cycle after the address; writes past the buffer's end are
dropped.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import Space

from .interfaces import WORD, ReadPort, WritePort


def _log2(value: int) -> int:
    return value.bit_length() - 1


def _pow2_at_least(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def _prime_above(value: int) -> int:
    candidate = value + 1
    while any(candidate % d == 0 for d in range(2, int(candidate ** 0.5) + 1)):
        candidate += 1
    return max(candidate, 2)


class BankedBuffer(wiring.Component):
    """`words` FP16 words in `banks` memories of `chunk`-word rows (chunk c: row c div banks of memory
    c mod banks), with the read and write ports named in `reads` / `writes` (name -> width in words,
    each <= chunk). A read port returns buffer[addr + i] for i < width one cycle after `addr`; a write
    port writes data[i] to addr + i where en and mask[i] (and addr + i < words); of two write ports on
    one word in one cycle, the one listed later wins. Throughput: one access per port per cycle."""

    def __init__(self, words: int, *, chunk: int, banks: int, reads: dict, writes: dict):
        if chunk < 1 or chunk & (chunk - 1):
            raise ValueError(f"chunk must be a power of two, got {chunk}")
        if banks < 2:
            raise ValueError(f"banks must be at least 2, got {banks}")
        if words % chunk:
            raise ValueError(f"{words} words do not split into {chunk}-word chunks")
        wide = [w for w in list(reads.values()) + list(writes.values()) if not 1 <= w <= chunk]
        if wide:
            raise ValueError(f"ports of {wide} words: each must be 1 to the {chunk}-word chunk")
        self.words, self.chunk, self.banks = words, chunk, banks
        self.chunks = words // chunk
        self.rows = -(-self.chunks // banks)
        self.reads, self.writes = dict(reads), dict(writes)
        super().__init__({**{name: In(ReadPort(w)) for name, w in reads.items()},
                          **{name: In(WritePort(w)) for name, w in writes.items()}})

    def _place(self, m: Module, addr, *, name: str):
        """An access at `addr`: its first chunk's bank and offset, and for each memory b which of the
        access's two chunks lands there (0, 1, or 2: none), that chunk's row, and whether it is in the buffer."""
        lc, P = _log2(self.chunk), self.banks
        first = Signal(len(addr) - lc, name=f"{name}_chunk")
        bank = Signal(range(P), name=f"{name}_bank")
        row = Signal(len(first), name=f"{name}_row")
        m.d.comb += [first.eq(addr >> lc), bank.eq(first % P), row.eq(first // P)]
        places = []
        for b in range(P):
            which = Signal(2, name=f"{name}_b{b}_which")
            m.d.comb += which.eq(Mux(bank == b, 0, Mux(bank == (b - 1) % P, 1, 2)))
            # the second chunk starts a new row when the first is in the last bank
            local = Signal(range(max(2, self.rows)), name=f"{name}_b{b}_row")
            m.d.comb += local.eq(row + (bank == P - 1) if b == 0 else row)
            places.append((which, local, first + which < self.chunks))
        return bank, addr[:lc] if lc else 0, places

    def elaborate(self, platform):
        m = Module()
        C, lc, P = self.chunk, _log2(self.chunk), self.banks
        row_layout = data.ArrayLayout(WORD, C)
        mems = [memory.Memory(shape=row_layout, depth=self.rows, init=[]) for _ in range(P)]
        for b, mem in enumerate(mems):
            m.submodules[f"mem{b}"] = mem
        for name, width in self.reads.items():
            port = getattr(self, name)
            bank, offset, places = self._place(m, port.addr, name=name)
            rows = []
            for b, (_, row, _) in enumerate(places):
                rd = mems[b].read_port()
                m.d.comb += rd.addr.eq(row)
                rows.append(rd.data.as_value())
            bank_d = Signal(range(P), name=f"{name}_bank_d")
            offset_d = Signal(max(lc, 1), name=f"{name}_offset_d")
            m.d.sync += [bank_d.eq(bank), offset_d.eq(offset)]
            pick = Signal(2 * C * WORD, name=f"{name}_window")
            for b in range(P):
                with m.If(bank_d == b):
                    m.d.comb += pick.eq(Cat(rows[b], rows[(b + 1) % P]))
            m.d.comb += port.data.eq((pick >> (offset_d * WORD))[:width * WORD])
        for name, width in self.writes.items():
            port = getattr(self, name)
            _, offset, places = self._place(m, port.addr, name=name)
            window = Signal(2 * C * WORD, name=f"{name}_window")
            enables = Signal(2 * C, name=f"{name}_enables")
            m.d.comb += [window.eq(port.data.as_value() << (offset * WORD)),
                         enables.eq(Mux(port.en, port.mask, 0) << offset)]
            for b, (which, row, inside) in enumerate(places):
                wp = mems[b].write_port(granularity=1)
                m.d.comb += [wp.addr.eq(row),
                             wp.data.eq(Mux(which[0], window[C * WORD:], window[:C * WORD])),
                             wp.en.eq(Mux(inside & ~which[1], Mux(which[0], enables[C:], enables[:C]), 0))]
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


def buffer_geometry(cfg: ArchConfig, space: Space, ports: dict) -> tuple[int, int]:
    """(chunk, banks) of a buffer: the chunk is the widest port it must serve, and at least the config's
    lane widths (mac_width, vector_width for ABUF; mac_width for WBUF); banks is the smallest prime above
    mpu_lanes (see the module docstring)."""
    widths = [sig.words for sp, sig in ports.values() if sp == space]
    lanes = [cfg.mac_width] + ([cfg.vector_width] if space == Space.ABUF else [])
    return _pow2_at_least(max(widths + lanes)), _prime_above(cfg.mpu_lanes)


class Buffers(wiring.Component):
    """ABUF (`abuf_words`) and WBUF (`wbuf_words`), sized from `cfg`, with the ports in `ports`: member
    name -> (Space.ABUF or Space.WBUF, ReadPort(w) or WritePort(w)), each member facing the unit that
    drives it. Write ports listed later take precedence on the same word."""

    def __init__(self, cfg: ArchConfig, ports: dict):
        self.cfg = cfg
        self.ports = dict(ports)
        for name, (space, sig) in self.ports.items():
            if space not in (Space.ABUF, Space.WBUF) or not isinstance(sig, (ReadPort, WritePort)):
                raise ValueError(f"buffer port {name!r}: {space} {sig!r} is not an ABUF/WBUF read or write port")
        self.geometry = {space: buffer_geometry(cfg, space, self.ports) for space in (Space.ABUF, Space.WBUF)}
        super().__init__({name: In(sig) for name, (space, sig) in self.ports.items()})

    def elaborate(self, platform):
        m = Module()
        for space, words in ((Space.ABUF, self.cfg.abuf_words), (Space.WBUF, self.cfg.wbuf_words)):
            mine = {name: sig for name, (sp, sig) in self.ports.items() if sp == space}
            chunk, banks = self.geometry[space]
            buf = BankedBuffer(words, chunk=chunk, banks=banks,
                               reads={n: s.words for n, s in mine.items() if isinstance(s, ReadPort)},
                               writes={n: s.words for n, s in mine.items() if isinstance(s, WritePort)})
            m.submodules[space.name.lower()] = buf
            for name in mine:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(buf, name))
        return m
