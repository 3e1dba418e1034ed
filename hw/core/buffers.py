"""The on-chip buffers: ABUF (activations) and WBUF (weights), as `amaranth.lib.memory.Memory`.

Each buffer is *chunk-banked*: its words are cut into chunks of `chunk` words, and chunk c is row
c div banks of memory c mod banks, a memory of `chunk`-word rows with one write enable per word. A port
of up to `chunk` words at any word address touches at most two consecutive chunks, which lie in two
different memories, so it completes in one cycle: the two rows are read (or written with their word
enables) and the words are shifted into place (`BankedBuffer`). Wide rows are what an FPGA's block
memories hold densely (a URAM is 4,096 rows of 72 bits).

The matrix unit's weight tiles (`TileReadPort`: mpu_lanes reads of mac_width words) share one read port
per memory: each cycle every memory reads one distinct chunk, so a tile takes as many cycles as its
busiest memory holds distinct chunks (`tile_read_cycles`, which the cycle model charges), and the unit
stalls for the rest. `banks` is the smallest prime above mpu_lanes (17 at u280; `ArchConfig.buffer_banks`):
lane l's chunk c0 + l * stride / chunk then falls in a memory of its own for every stride that is not a
multiple of banks chunks, so the compiled programs' weight reads take one cycle. With a power of two (16)
their strides (768, 1,024, 1,600, ... words) put many lanes in one memory: `scripts/bank_conflicts.py`
counts 0.9 to 15 times the matrix unit's cycles more in stalls for 16 banks, none for 17. Every other
port is still a memory port of its own (docs/rtl-core.md, "Resources").

WBUF's two banks are the halves of its address space (the DMA fills one while the matrix unit reads the
other); every port is a memory port of its own, so the halves need no memories of their own. Ports are
named by what they carry (`abuf_x`, `wbuf_w`, ...); `WriteArbiter` shares one write port between two
clients. Reads return data READ_LATENCY = 1 cycle after the address; writes past the buffer's end are
dropped.
"""
from __future__ import annotations

import numpy as np
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import Space

from .interfaces import WORD, ReadPort, TileReadPort, WritePort


ADDRESS = 33
"""Bits of a chunk index or row computed from a 32-bit word address (with room for the next chunk)."""


def _log2(value: int) -> int:
    return value.bit_length() - 1


class BankedBuffer(wiring.Component):
    """`words` FP16 words in `banks` memories of `chunk`-word rows (chunk c: row c div banks of memory
    c mod banks), with the read and write ports named in `reads` / `writes` (name -> width in words,
    each <= chunk) and the tile ports in `tiles` (name -> (lanes, width)). A read port returns
    buffer[addr + i] for i < width one cycle after `addr`; a write port writes data[i] to addr + i where
    en and mask[i] (and addr + i < words); of two write ports on one word in one cycle, the one listed
    later wins. Throughput: one access per port per cycle; a tile port's request takes
    `tile_read_cycles` cycles (see `_tile_port`)."""

    def __init__(self, words: int, *, chunk: int, banks: int, reads: dict, writes: dict, tiles: dict | None = None):
        if chunk < 1 or chunk & (chunk - 1):
            raise ValueError(f"chunk must be a power of two, got {chunk}")
        if banks < 2:
            raise ValueError(f"banks must be at least 2, got {banks}")
        if words % chunk:
            raise ValueError(f"{words} words do not split into {chunk}-word chunks")
        tiles = dict(tiles or {})
        wide = [w for w in [*reads.values(), *writes.values(), *(w for _, w in tiles.values())] if not 1 <= w <= chunk]
        if wide:
            raise ValueError(f"ports of {wide} words: each must be 1 to the {chunk}-word chunk")
        self.words, self.chunk, self.banks = words, chunk, banks
        self.chunks = words // chunk
        self.rows = -(-self.chunks // banks)
        self.reads, self.writes, self.tiles = dict(reads), dict(writes), tiles
        super().__init__({**{name: In(ReadPort(w)) for name, w in reads.items()},
                          **{name: In(WritePort(w)) for name, w in writes.items()},
                          **{name: In(TileReadPort(lanes, w)) for name, (lanes, w) in tiles.items()}})

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
        for name, (lanes, width) in self.tiles.items():
            self._tile_port(m, mems, name, lanes, width)
        return m

    def _tile_port(self, m: Module, mems: list, name: str, lanes: int, width: int):
        """One read port per memory shared by the lanes of a TileReadPort. Each lane needs its first chunk,
        and the next one when its words run past it (parts 2l and 2l + 1). Each cycle every memory reads the
        row of its lowest-numbered pending part, which serves every pending part of that chunk; `ready` when
        none remains. A part's row is kept when it arrives, so the last cycle's rows complete the tile."""
        port = getattr(self, name)
        C, lc, P = self.chunk, _log2(self.chunk), self.banks
        parts = []                                      # (needed, bank, row) of part 2l, 2l + 1
        offsets = []
        for lane in range(lanes):
            first, row = Signal(ADDRESS, name=f"{name}_l{lane}_chunk"), Signal(ADDRESS, name=f"{name}_l{lane}_row")
            bank = Signal(range(P), name=f"{name}_l{lane}_bank")
            m.d.comb += [first.eq(port.addr[lane] >> lc), bank.eq(first % P), row.eq(first // P)]
            offset = port.addr[lane][:lc] if lc else 0
            wraps = bank == P - 1
            parts.append((port.en[lane], bank, row))
            parts.append((port.en[lane] & (offset + width > C), Mux(wraps, 0, bank + 1), row + wraps))
            offsets.append(offset)
        served = Signal(2 * lanes, name=f"{name}_served")
        pending = Signal(2 * lanes, name=f"{name}_pending")
        m.d.comb += pending.eq(Cat(*(needed for needed, _, _ in parts)) & ~served)
        picked = []
        for b in range(P):
            row_b = Signal(range(max(2, self.rows)), name=f"{name}_b{b}_row")
            any_b = Signal(name=f"{name}_b{b}_any")
            for p in reversed(range(2 * lanes)):        # the lowest pending part in this bank wins
                with m.If(pending[p] & (parts[p][1] == b)):
                    m.d.comb += [row_b.eq(parts[p][2]), any_b.eq(1)]
            rd = mems[b].read_port()
            m.d.comb += rd.addr.eq(row_b)
            picked.append((row_b, any_b, rd.data.as_value()))
        now = Signal(2 * lanes, name=f"{name}_now")
        for p, (_, bank, row) in enumerate(parts):
            hit = 0
            for b, (row_b, any_b, _) in enumerate(picked):
                hit = hit | ((bank == b) & any_b & (row == row_b))
            m.d.comb += now[p].eq(pending[p] & hit)
        m.d.comb += port.ready.eq((pending & ~now) == 0)
        m.d.sync += served.eq(Mux(port.ready, 0, served | now))
        now_d = Signal.like(now, name=f"{name}_now_d")
        m.d.sync += now_d.eq(now)
        rows = []
        for p, (_, bank, _) in enumerate(parts):
            bank_d = Signal(range(P), name=f"{name}_p{p}_bank_d")
            kept = Signal(C * WORD, name=f"{name}_p{p}_kept")
            value = Signal(C * WORD, name=f"{name}_p{p}_row")
            m.d.sync += [bank_d.eq(bank), kept.eq(value)]
            arrived = picked[0][2]
            for b in range(1, P):
                arrived = Mux(bank_d == b, picked[b][2], arrived)
            m.d.comb += value.eq(Mux(now_d[p], arrived, kept))
            rows.append(value)
        for lane in range(lanes):
            offset_d = Signal(max(lc, 1), name=f"{name}_l{lane}_offset_d")
            m.d.sync += offset_d.eq(offsets[lane])
            window = Cat(rows[2 * lane], rows[2 * lane + 1])
            m.d.comb += port.data[lane].eq((window >> (offset_d * WORD))[:width * WORD])


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


def tile_read_cycles(starts: np.ndarray, enabled: np.ndarray, words: int, chunk: int, banks: int,
                     bank_of=None) -> np.ndarray:
    """Cycles of TileReadPort requests (the last axis: the lanes' first words `starts`, `enabled`; each
    lane reads `words`): the largest number of distinct chunks one bank holds, at least 1 (`bank_of(c)`:
    a chunk's bank, by default c mod banks)."""
    first, last = starts // chunk, (starts + words - 1) // chunk
    chunks = np.concatenate([np.where(enabled, first, -1), np.where(enabled & (last != first), last, -1)], axis=-1)
    chunks = np.sort(chunks, axis=-1)
    distinct = (chunks >= 0) & np.concatenate([np.ones_like(chunks[..., :1], bool), chunks[..., 1:] != chunks[..., :-1]],
                                              axis=-1)
    bank = np.where(distinct, (bank_of or (lambda c: c % banks))(np.maximum(chunks, 0)), banks)
    return np.maximum(np.stack([(bank == b).sum(axis=-1) for b in range(banks)], axis=-1).max(axis=-1), 1)


class Buffers(wiring.Component):
    """ABUF (`abuf_words`) and WBUF (`wbuf_words`), sized from `cfg`, with the ports in `ports`: member
    name -> (Space.ABUF or Space.WBUF, ReadPort(w), WritePort(w) or TileReadPort(lanes, w)), each member
    facing the unit that drives it. Write ports listed later take precedence on the same word."""

    def __init__(self, cfg: ArchConfig, ports: dict):
        self.cfg = cfg
        self.ports = dict(ports)
        for name, (space, sig) in self.ports.items():
            if space not in (Space.ABUF, Space.WBUF) or not isinstance(sig, (ReadPort, WritePort, TileReadPort)):
                raise ValueError(f"buffer port {name!r}: {space} {sig!r} is not an ABUF/WBUF read, write or tile port")
        self.chunk, self.banks = cfg.buffer_chunk_words, cfg.buffer_banks
        super().__init__({name: In(sig) for name, (space, sig) in self.ports.items()})

    def elaborate(self, platform):
        m = Module()
        for space, words in ((Space.ABUF, self.cfg.abuf_words), (Space.WBUF, self.cfg.wbuf_words)):
            mine = {name: sig for name, (sp, sig) in self.ports.items() if sp == space}
            buf = BankedBuffer(words, chunk=self.chunk, banks=self.banks,
                               reads={n: s.words for n, s in mine.items() if isinstance(s, ReadPort)},
                               writes={n: s.words for n, s in mine.items() if isinstance(s, WritePort)},
                               tiles={n: (s.lanes, s.words) for n, s in mine.items() if isinstance(s, TileReadPort)})
            m.submodules[space.name.lower()] = buf
            for name in mine:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(buf, name))
        return m
