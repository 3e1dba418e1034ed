"""The on-chip buffers: ABUF (activations) and WBUF (weights), as `amaranth.lib.memory.Memory`.

Each buffer is *chunk-banked*: its words are cut into chunks of `chunk` words, and chunk c is row
c div banks of memory c mod banks, a memory of `chunk`-word rows with one write enable per word. A port
of up to `chunk` words at any word address touches at most two consecutive chunks, which lie in two
different memories, so it completes in one cycle: the two rows are read (or written with their word
enables) and the words are shifted into place (`BankedBuffer`). Wide rows are what an FPGA's block
memories hold densely (a URAM is 4,096 rows of 72 bits).

The lanes of a tile port (`TileReadPort`: the matrix unit's weight, x and bias tiles, the vector unit's
operands) share one read port per memory: each cycle every memory reads one distinct chunk, so a request
takes as many cycles as its busiest memory holds distinct chunks (`hw/banks.tile_read_cycles`, which the cycle model
charges), and the unit stalls for the rest. `banks` is the smallest prime above mpu_lanes (17 at u280; `ArchConfig.buffer_banks`):
lane l's chunk c0 + l * stride / chunk then falls in a memory of its own for every stride that is not a
multiple of banks chunks, so the compiled programs' weight reads take one cycle. With a power of two (16)
their strides (768, 1,024, 1,600, ... words) put many lanes in one memory: `scripts/bank_conflicts.py`
counts 0.9 to 15 times the matrix unit's cycles more in stalls for 16 banks, none for 17.

The single reads (`SharedReadPort`: the DMA engines' STORE beats, the on-chip DMA's chunks, the router's
payload) and the tile ports of a buffer all share that one read port per memory (`_reads`): each cycle a
memory serves first the single read its group grants (the `urgent` ones first: the DMA marks the engines
behind the leader, the router marks its reads; then in the order listed; `_grants`), else one tile port's
chunk, the tile ports taking turns each cycle. A requester that is not served holds its request, and a tile
port keeps the chunks it was already given. The writes share one write port per memory (`_writes`): the DMA
engines' LOAD and GATHER rows (`BankWritePort`: a row per memory, which the DMA's crossbar chose among its engines
for both buffers at once) and one *unit write* a cycle (`_unit_write`), which the on-chip DMA's copies
(`RowWritePort`, two chunks) and the units' writes (`SharedWritePort`: the matrix unit's results and row maxima,
the vector unit's, the router's) take in turn, the urgent ones first, each class in the order listed; the unit
write is granted after the engine rows (the urgent ones first, `_grants`). So each memory chooses its row among
three (its engine row and the unit write's two chunks), where a choice among every writer's chunks took 11 at u280
(ABUF's write choice 112K LUTs against 19K; docs/rtl-core.md, "Resources"); the cost is that two units' writes in
one cycle take two. A plain `ReadPort` or
`WritePort` (the harness's dump and load) is still a memory port of its own (docs/rtl-core.md, "Resources").

WBUF's weight slots (the DMA fills one while the matrix unit reads another) and KV areas are the compiler's
cuts of its address space (host/compiler/layout.py); they need no memories of their own, as any port reaches any
address. Ports are
named by what they carry (`abuf_tiles`, `wbuf_dst`, ...); `WriteArbiter` shares one write port between two
clients. Reads return data READ_LATENCY = 1 cycle after the address; writes past the buffer's end are
dropped.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In

from ringgpt.hw.banks import chunk_of, place
from ringgpt.hw.intmath import log2
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import Space

from .interfaces import (WORD, BankWritePort, ReadPort, RowWritePort, SharedReadPort, SharedWritePort, TileReadPort,
                         WritePort)


RAM_STYLE = "ultra"
"""The memories' Xilinx `ram_style`: UltraRAM (4,096 rows of 72 bits, 960 on the U280; a 64-word row takes 15 side
by side, whose 9 byte enables a word's two bytes share). WBUF alone is 71 Mbit, as much as all of the U280's block
RAM: without it Yosys 0.23 maps a u280 ABUF to 1,088 RAMB36, with it to 255 URAM288 (docs/rtl-core.md, "Resources
at u280")."""

ADDRESS = 33
"""Bits of a chunk index or row computed from a 32-bit word address (with room for the next chunk)."""



def select(index, values: list) -> Value:
    """values[index] (`index` < len(values)), each zero-extended to the widest: a binary tree of 2:1 muxes, one
    level an index bit, which synthesis packs into LUTs and the CLBs' MUXF7/MUXF8 (Yosys `synth_xilinx -widemux`:
    17 values 5 LUTs a bit, 33 values 9; a `word_select` 6 and 14, a chain of compares 17 and 32;
    hw/resource_estimates.py measures it, `port_parts`)."""
    values = [Value.cast(v) for v in values]
    width = max(len(v) for v in values)
    level = [Cat(v, Const(0, width - len(v))) for v in values]
    for bit in range(len(Value.cast(index))):
        if len(level) == 1:
            break
        level = [Mux(index[bit], level[j + 1], level[j]) if j + 1 < len(level) else level[j]
                 for j in range(0, len(level), 2)]
    return level[0]


def one_hot_index(bits) -> Value:
    """The number of the one set bit of `bits` (0 when none): the OR of the numbers of the set bits, so `bits`
    must have one set at most (a grant), the index `select` takes."""
    bits = Value.cast(bits)
    width = max(1, (len(bits) - 1).bit_length())
    return Cat(*(Cat(*(bits[k] for k in range(len(bits)) if k >> i & 1)).any() for i in range(width)))


def urgent_first(m: Module, asks, urgent, *, name: str) -> Signal:
    """One-hot: the lowest-numbered of `asks` that is `urgent`, else the lowest-numbered of `asks` (none: 0)."""
    asks, urgent = Value.cast(asks), Value.cast(urgent)
    pool, chosen = Signal(len(asks), name=f"{name}_pool"), Signal(len(asks), name=f"{name}_chosen")
    m.d.comb += [pool.eq(Mux((asks & urgent).any(), asks & urgent, asks)), chosen.eq(pool & (~pool + 1))]
    return chosen


def words_at(window, offset, words: int) -> Value:
    """The `words` FP16 words of `window` from word `offset` on: a read's words out of its two rows, shifted in
    radix-4 stages (two offset bits each, the highest first), each stage keeping only the words the later stages
    can still reach (Yosys: 5,821 LUTs for 64 words out of 128, against 7,548 for one `>>`)."""
    window, offset = Value.cast(window), Value.cast(offset)
    for low in reversed(range(0, len(offset), 2)):
        digit, step = offset[low:low + 2], 1 << low
        keep = (words + step - 1) * WORD
        window = select(digit, [window[shift * step * WORD:][:keep] for shift in range(1 << len(digit))])
    return window[:words * WORD]


def placed(data, offset) -> Value:
    """`data`'s FP16 words moved up by `offset` words (a write's words into the window of its two chunks)."""
    return data << (offset * WORD)


class BankedBuffer(wiring.Component):
    """`words` FP16 words in `banks` memories of `chunk`-word rows (chunk c: row c div banks of memory
    c mod banks), with the read and write ports named in `reads` / `writes` (name -> width in words,
    each <= chunk) and the tile ports in `tiles` (name -> TileReadPort signature). A read port returns
    buffer[addr + i] for i < width one cycle after `addr`; a write port writes data[i] to addr + i where
    en and mask[i] (and addr + i < words); of two write ports on one word in one cycle, the one listed
    later wins. Throughput: one access per port per cycle; a tile port's request takes at least
    `banks.tile_read_cycles` cycles. The tile ports and the `shared_reads` (name -> width) share one read port per
    memory (the shared reads granted first, see `_reads`), and the `row_writes` (name -> rows: RowWritePorts), the
    `bank_writes` (names of BankWritePorts: a row per memory, each memory's one requester) and `shared_writes`
    (name -> width: SharedWritePorts) one write port per memory (in that order),
    each group granted the urgent requesters first, each class in the order listed (see `_grants`); the group's
    write wins over the plain write ports on a shared word."""

    def __init__(self, words: int, *, chunk: int, banks: int, reads: dict, writes: dict, tiles: dict | None = None,
                 shared_reads: dict | None = None, row_writes: dict | None = None, bank_writes=(),
                 shared_writes: dict | None = None):
        if chunk < 1 or chunk & (chunk - 1):
            raise ValueError(f"chunk must be a power of two, got {chunk}")
        if banks < 2:
            raise ValueError(f"banks must be at least 2, got {banks}")
        if words % chunk:
            raise ValueError(f"{words} words do not split into {chunk}-word chunks")
        tiles, shared_reads, shared_writes = dict(tiles or {}), dict(shared_reads or {}), dict(shared_writes or {})
        wide = [w for w in [*reads.values(), *writes.values(), *(t.words for t in tiles.values()), *shared_reads.values(),
                                *shared_writes.values()]
                if not 1 <= w <= chunk]
        if wide:
            raise ValueError(f"ports of {wide} words: each must be 1 to the {chunk}-word chunk")
        self.words, self.chunk, self.banks = words, chunk, banks
        self.chunks = words // chunk
        self.rows = -(-self.chunks // banks)
        self.reads, self.writes, self.tiles = dict(reads), dict(writes), tiles
        self.shared_reads, self.row_writes, self.shared_writes = shared_reads, dict(row_writes or {}), shared_writes
        self.bank_writes = tuple(bank_writes)
        super().__init__({**{name: In(ReadPort(w)) for name, w in reads.items()},
                          **{name: In(WritePort(w)) for name, w in writes.items()},
                          **{name: In(tile) for name, tile in tiles.items()},
                          **{name: In(SharedReadPort(w)) for name, w in shared_reads.items()},
                          **{name: In(RowWritePort(chunk, rows)) for name, rows in self.row_writes.items()},
                          **{name: In(BankWritePort(chunk, banks)) for name in self.bank_writes},
                          **{name: In(SharedWritePort(w)) for name, w in shared_writes.items()}})

    def _place(self, m: Module, addr, *, name: str):
        """An access at `addr`: its first chunk's bank and offset, and for each memory b which of the
        access's two chunks lands there (0, 1, or 2: none), that chunk's row, and whether it is in the buffer."""
        lc, P = log2(self.chunk), self.banks
        first = Signal(len(addr) - lc, name=f"{name}_chunk")
        bank = Signal(range(P), name=f"{name}_bank")
        row = Signal(len(first), name=f"{name}_row")
        m.d.comb += [first.eq(chunk_of(addr, self.chunk)), *(s.eq(v) for s, v in zip((bank, row), place(first, P)))]
        places = []
        for b in range(P):
            which = Signal(2, name=f"{name}_b{b}_which")
            m.d.comb += which.eq(Mux(bank == b, 0, Mux(bank == (b - 1) % P, 1, 2)))
            # the second chunk starts a new row when the first is in the last bank
            local = Signal(range(max(2, self.rows)), name=f"{name}_b{b}_row")
            m.d.comb += local.eq(row + (bank == P - 1) if b == 0 else row)
            places.append((which, local, first + which < self.chunks))
        return bank, addr[:lc] if lc else 0, places

    def _pick(self, m: Module, name: str, port, bank, offset, rows: list, width: int):
        """A read's data: the `width` words at `offset` of the rows of memories `bank` and `bank` + 1 (`rows`:
        each memory's read data), one cycle after its address."""
        C, lc, P = self.chunk, log2(self.chunk), self.banks
        bank_d = Signal(range(P), name=f"{name}_bank_d")
        offset_d = Signal(max(lc, 1), name=f"{name}_offset_d")
        m.d.sync += [bank_d.eq(bank), offset_d.eq(offset)]
        pick = Signal(2 * C * WORD, name=f"{name}_window")
        m.d.comb += pick.eq(select(bank_d, [Cat(rows[b], rows[(b + 1) % P]) for b in range(P)]))
        m.d.comb += port.data.eq(words_at(pick, offset_d, width))

    def elaborate(self, platform):
        m = Module()
        C, P = self.chunk, self.banks
        row_layout = data.ArrayLayout(WORD, C)
        # a power of two of rows (URAM and block RAM are anyway), so that a read of any row address is defined in
        # simulation: the engines' STORE reads start at the buffer word of a beat's lane 0, which may lie before
        # the buffer's first word or past its last (words wstrb leaves out)
        depth = 1 << (self.rows - 1).bit_length()
        mems = [memory.Memory(shape=row_layout, depth=depth, init=[], attrs={"ram_style": RAM_STYLE}) for _ in range(P)]
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
            self._pick(m, name, port, bank, offset, rows, width)
        for name, width in self.writes.items():
            port = getattr(self, name)
            _, offset, places = self._place(m, port.addr, name=name)
            window = Signal(2 * C * WORD, name=f"{name}_window")
            enables = Signal(2 * C, name=f"{name}_enables")
            m.d.comb += [window.eq(placed(port.data.as_value(), offset)),
                         enables.eq(Mux(port.en, port.mask, 0) << offset)]
            for b, (which, row, inside) in enumerate(places):
                wp = mems[b].write_port(granularity=1)
                m.d.comb += [wp.addr.eq(row),
                             wp.data.eq(Mux(which[0], window[C * WORD:], window[:C * WORD])),
                             wp.en.eq(Mux(inside & ~which[1], Mux(which[0], enables[C:], enables[:C]), 0))]
        self._reads(m, mems)
        self._writes(m, mems)
        return m

    def _grants(self, m: Module, touches: list, urgent: list, *, name: str) -> list:
        """Grants of a group sharing one port per memory: requester k (`touches[k]`: the memories it asks for,
        none when it asks nothing) is granted when no requester granted before it took one of them; the
        `urgent` requesters are considered first, each class in the group's order. Returns each requester's
        `ready` (its memories are free of the grants before it)."""
        taken = Const(0, self.banks)
        free = {}
        for first in (1, 0):
            for k, touch in enumerate(touches):
                mine = urgent[k] if first else ~urgent[k]
                free[k, first] = Signal(name=f"{name}{k}_free{first}")
                now = Signal(self.banks, name=f"{name}{k}_taken{first}")
                m.d.comb += [free[k, first].eq((touch & taken) == 0), now.eq(taken | Mux(mine & free[k, first], touch, 0))]
                taken = now
        readies = []
        for k in range(len(touches)):
            readies.append(Signal(name=f"{name}{k}_ready"))
            m.d.comb += readies[-1].eq(Mux(urgent[k], free[k, 1], free[k, 0]))
        return readies

    def _writes(self, m: Module, mems: list):
        """One write port per memory for the BankWritePorts and the buffer's one unit write (`_unit_write`: the
        RowWritePorts and SharedWritePorts take turns for it), in that order (`_grants`): each memory writes the
        row (and word enables) of the granted requester whose chunk lies in it, so it chooses among three rows:
        its BankWritePort row and the unit write's two chunks."""
        if not (self.row_writes or self.bank_writes or self.shared_writes):
            return
        P = self.banks
        requests = [r for name in self.bank_writes for r in self._bank_writes(m, name)]
        if self.row_writes or self.shared_writes:
            requests.append(self._unit_write(m))
        readies = self._grants(m, [touch for _, _, touch, _ in requests], [urgent for *_, urgent in requests],
                               name="write")
        for (ready_port, *_), ready in zip(requests, readies):
            m.d.comb += ready_port.eq(ready)
        for b in range(P):
            # the grants give each memory to one requester at most, and a requester's two chunks lie in two
            # memories: at most one candidate is `mine`, so its number is the OR of the numbers of those that are
            candidates = [(ready & touch[b] & (hb == b if isinstance(hb, Value) else 1), hrow, hdata,
                           Mux(inside, hmask, 0))
                          for (_, halves, touch, _), ready in zip(requests, readies)
                          for hb, hrow, hdata, hmask, inside in halves if isinstance(hb, Value) or hb == b]
            mine = Cat(*(c[0] for c in candidates))
            index = Signal(range(max(2, len(candidates))), name=f"write_b{b}_index")
            m.d.comb += index.eq(one_hot_index(mine))
            wp = mems[b].write_port(granularity=1)
            m.d.comb += [wp.addr.eq(select(index, [c[1] for c in candidates])),
                         wp.data.eq(select(index, [c[2] for c in candidates])),
                         wp.en.eq(Mux(mine.any(), select(index, [c[3] for c in candidates]), 0))]

    def _unit_write(self, m: Module) -> tuple:
        """The buffer's one unit write a cycle, taken in turn by the RowWritePorts and SharedWritePorts: the first
        asking of them, the urgent ones first, each class in the order listed (`urgent_first`), is chosen, and
        its `ready` is the unit write's grant (the others asking wait; one not asking is ready). A shared write's
        words are shifted into the two chunks of its address (one shift for them all), and it claims both when
        its window runs past the first; a row write claims the chunks its mask writes. Returns the request as
        `_bank_writes`' are: (ready, its two chunks' (memory, row, row data, word enables, inside the buffer), the
        memories it claims, urgent)."""
        C, lc, P = self.chunk, log2(self.chunk), self.banks
        rows, shared = list(self.row_writes), list(self.shared_writes)
        ports = [getattr(self, name) for name in rows + shared]
        asks, urgent = Cat(*(p.en for p in ports)), Cat(*(p.urgent for p in ports))
        chosen = urgent_first(m, asks, urgent, name="unit_write")
        index = Signal(range(max(2, len(ports))), name="unit_write_index")
        ready = Signal(name="unit_write_ready")
        m.d.comb += index.eq(one_hot_index(chosen))
        for k, port in enumerate(ports):
            m.d.comb += port.ready.eq(~port.en | (chosen[k] & ready))
        first = Signal(ADDRESS, name="unit_write_chunk")
        window = Signal(2 * C * WORD, name="unit_write_window")
        enables = Signal(2 * C, name="unit_write_enables")
        claims = Signal(2, name="unit_write_claims")
        if shared:
            ports_s = [getattr(self, name) for name in shared]
            at = Signal(range(len(shared)), name="shared_write_index") if len(shared) > 1 else 0
            if len(shared) > 1:
                m.d.comb += at.eq(index - len(rows))
            addr = Signal(len(ports_s[0].addr), name="shared_write_addr")
            m.d.comb += addr.eq(select(at, [p.addr for p in ports_s]))
            offset = addr[:lc] if lc else 0
            words = select(at, [p.data.as_value() for p in ports_s])
            mask = select(at, [p.mask for p in ports_s])
            runs_past = select(at, [offset + self.shared_writes[name] > C for name in shared])
            shared_fields = (addr >> lc, placed(words, offset), mask << offset, Cat(Const(1, 1), runs_past))
        if rows:
            at = Signal(range(max(2, len(rows))), name="row_write_index")
            m.d.comb += at.eq(index)
            row_ports = [getattr(self, name) for name in rows]
            masks = Signal(2 * C, name="row_write_mask")
            m.d.comb += masks.eq(select(at, [p.mask for p in row_ports]))
            row_fields = (select(at, [p.first for p in row_ports]), select(at, [p.data.as_value() for p in row_ports]),
                          masks, Cat(masks[:C] != 0, masks[C:] != 0))
        fields = (row_fields if not shared else shared_fields if not rows else
                  [Mux(index < len(rows), r, s) for r, s in zip(row_fields, shared_fields)])
        m.d.comb += [first.eq(fields[0]), window.eq(fields[1]), enables.eq(fields[2]), claims.eq(fields[3])]
        bank, row = Signal(range(P), name="unit_write_bank"), Signal(ADDRESS, name="unit_write_row")
        m.d.comb += [s.eq(v) for s, v in zip((bank, row), place(first, P))]
        wraps = bank == P - 1
        halves = ((bank, row, window[:C * WORD], enables[:C], first < self.chunks),
                  (Mux(wraps, 0, bank + 1), row + wraps, window[C * WORD:], enables[C:], first + 1 < self.chunks))
        touch = Signal(P, name="unit_write_touch")
        m.d.comb += [touch[b].eq(asks.any() & Cat(*((half[0] == b) & claim for half, claim in zip(halves, claims))).any())
                     for b in range(P)]
        return ready, halves, touch, (chosen & urgent).any()

    def _bank_writes(self, m: Module, name: str) -> list:
        """The write requests of a BankWritePort, one a memory, as `_unit_write`'s: memory b's row, a candidate of
        memory b alone (its number a constant), inside the buffer when below the rows memory b holds."""
        P, port = self.banks, getattr(self, name)
        out = []
        for b in range(P):
            held = -(-(self.chunks - b) // P)
            touch = Signal(P, name=f"{name}_b{b}_touch")
            m.d.comb += touch.eq(port.en[b] << b)
            out.append((port.ready[b], ((b, port.row[b], port.data[b].as_value(), port.mask[b], port.row[b] < held),),
                        touch, port.urgent[b]))
        return out

    def _reads(self, m: Module, mems: list):
        """One read port per memory for all the TileReadPorts and SharedReadPorts of the buffer. Each cycle each
        memory serves first the SharedReadPort the group grants it to (`_grants`), else one tile port: the
        first in turn that has a pending part there (the turn passes to the next tile port every cycle, so no
        tile port waits for another's whole instruction), which reads the row of its lowest-numbered pending
        part in that memory (`_tile_requests`)."""
        if not (self.tiles or self.shared_reads):
            return
        P = self.banks
        shared = self._shared_requests(m)
        tiles = {name: self._tile_requests(m, name, tile) for name, tile in self.tiles.items()}
        names = list(tiles)
        turn = Signal(range(max(2, len(names))), name="tile_turn")
        if len(names) > 1:
            m.d.sync += turn.eq(Mux(turn == len(names) - 1, 0, turn + 1))
        rows, grants = [], {name: [] for name in names}
        for b in range(P):
            addr, taken = 0, Const(0, 1)
            for port, _, _, places, touch, ready in shared:
                mine = ready & touch[b]
                addr, taken = Mux(mine, places[b][1], addr), taken | mine
            for index, name in enumerate(names):
                want, row = tiles[name]["banks"][b]
                ahead = []                  # for each turn, the tile ports before this one
                for first in range(len(names)):
                    before = [(first + i) % len(names) for i in range((index - first) % len(names))]
                    ahead.append((turn == first) & Cat(Const(0, 1), *(tiles[names[i]]["banks"][b][0] for i in before)).any())
                grant = Signal(name=f"{name}_b{b}_grant")
                m.d.comb += grant.eq(want & ~taken & ~Cat(*ahead).any())
                addr = Mux(grant, row, addr)
                grants[name].append(grant)
            rd = mems[b].read_port()
            m.d.comb += rd.addr.eq(addr)
            rows.append(rd.data.as_value())
        for (port, bank, offset, _, _, ready), (name, width) in zip(shared, self.shared_reads.items()):
            m.d.comb += port.ready.eq(ready)
            self._pick(m, name, port, bank, offset, rows, width)
        for name, tile in self.tiles.items():
            self._tile_serve(m, name, tile, tiles[name], grants[name], rows)

    def _shared_requests(self, m: Module) -> list:
        """The SharedReadPorts' requests and grants: (port, first bank, offset, places, the memories it
        touches, ready) each."""
        C, P = self.chunk, self.banks
        out = []
        for name, width in self.shared_reads.items():
            port = getattr(self, name)
            bank, offset, places = self._place(m, port.addr, name=name)
            touch = Signal(P, name=f"{name}_touch")
            two = offset + width > C
            m.d.comb += [touch[b].eq(port.en & ((which == 0) | ((which == 1) & two)))
                         for b, (which, _, _) in enumerate(places)]
            out.append([port, bank, offset, places, touch])
        readies = self._grants(m, [touch for *_, touch in out], [port.urgent for port, *_ in out], name="shared_read")
        return [(*request, ready) for request, ready in zip(out, readies)]

    def _tile_requests(self, m: Module, name: str, tile: TileReadPort) -> dict:
        """A TileReadPort's parts: each lane needs its first chunk, and, unless it is `aligned`, the next one when its
        wanted words (`tile.widths`) run past it and it is not `single` (`lane_parts[l]`: its parts' numbers); the
        parts not yet served are `pending`. Per memory, `banks[b]`: whether a part is pending there and the row of
        the lowest-numbered one."""
        port = getattr(self, name)
        lc, P = log2(self.chunk), self.banks
        parts, offsets, lane_parts = [], [], []         # (needed, bank, row) of each part
        for lane in range(tile.lanes):
            first, row = Signal(ADDRESS, name=f"{name}_l{lane}_chunk"), Signal(ADDRESS, name=f"{name}_l{lane}_row")
            bank = Signal(range(P), name=f"{name}_l{lane}_bank")
            m.d.comb += [first.eq(chunk_of(port.addr[lane], self.chunk)),
                         *(s.eq(v) for s, v in zip((bank, row), place(first, P)))]
            offset = port.addr[lane][:lc] if lc else 0
            lane_parts.append([len(parts)])
            parts.append((port.en[lane], bank, row))
            if not tile.aligned[lane]:
                wraps = bank == P - 1
                runs_past = port.en[lane] & ~port.single[lane] & (offset + tile.widths[lane] > self.chunk)
                lane_parts[-1].append(len(parts))
                parts.append((runs_past, Mux(wraps, 0, bank + 1), row + wraps))
            offsets.append(offset)
        served = Signal(len(parts), name=f"{name}_served")
        pending = Signal(len(parts), name=f"{name}_pending")
        m.d.comb += pending.eq(Cat(*(needed for needed, _, _ in parts)) & ~served)
        banks = []
        for b in range(P):
            # Muxes, not Ifs: Icarus never evaluates an `always @*` whose inputs keep their initial values (an
            # idle port's), leaving the other ports' grants, which depend on it, X
            here = [pending[p] & (parts[p][1] == b) for p in range(len(parts))]
            row_b = Signal(range(max(2, self.rows)), name=f"{name}_b{b}_row")
            any_b = Signal(name=f"{name}_b{b}_any")
            value = 0
            for p in reversed(range(len(parts))):       # the lowest pending part in this bank wins
                value = Mux(here[p], parts[p][2], value)
            m.d.comb += [row_b.eq(value), any_b.eq(Cat(*here).any())]
            banks.append((any_b, row_b))
        return {"parts": parts, "offsets": offsets, "lane_parts": lane_parts, "served": served, "pending": pending,
                "banks": banks}

    def _tile_serve(self, m: Module, name: str, tile: TileReadPort, request: dict, grants: list, rows: list):
        """A TileReadPort's answer: a part is served when its memory was granted to the port and reads its row
        (which serves every pending part of that chunk); `ready` when none remains. A part's row is kept when it
        arrives, so the last cycle's rows complete the tile. A lane's words are shifted out of its two rows; an
        aligned lane's out of its one row by whole steps, a scalar lane's `single` word picked from it."""
        port = getattr(self, name)
        C, lc, P = self.chunk, log2(self.chunk), self.banks
        parts, pending, served = request["parts"], request["pending"], request["served"]
        now = Signal(len(parts), name=f"{name}_now")
        for p, (_, bank, row) in enumerate(parts):
            hit = 0
            for b, ((_, row_b), grant) in enumerate(zip(request["banks"], grants)):
                hit = hit | ((bank == b) & grant & (row == row_b))
            m.d.comb += now[p].eq(pending[p] & hit)
        m.d.comb += port.ready.eq((pending & ~now) == 0)
        m.d.sync += served.eq(Mux(port.ready, 0, served | now))
        now_d = Signal.like(now, name=f"{name}_now_d")
        m.d.sync += now_d.eq(now)
        values = []
        for p, (_, bank, _) in enumerate(parts):
            bank_d = Signal(range(P), name=f"{name}_p{p}_bank_d")
            kept = Signal(C * WORD, name=f"{name}_p{p}_kept")
            value = Signal(C * WORD, name=f"{name}_p{p}_row")
            m.d.sync += [bank_d.eq(bank), kept.eq(value)]
            m.d.comb += value.eq(Mux(now_d[p], select(bank_d, rows), kept))
            values.append(value)
        for lane, (offset, mine) in enumerate(zip(request["offsets"], request["lane_parts"])):
            offset_d = Signal(max(lc, 1), name=f"{name}_l{lane}_offset_d")
            m.d.sync += offset_d.eq(offset)
            if tile.aligned[lane]:
                row, step, keep = values[mine[0]], tile.aligned[lane], tile.words * WORD
                stepped = select(offset_d[log2(step):], [row[i * step * WORD:][:keep] for i in range(C // step)])
                if tile.scalars[lane]:
                    single_d = Signal(name=f"{name}_l{lane}_single_d")
                    m.d.sync += single_d.eq(port.single[lane])
                    word = select(offset_d, [row[i * WORD:(i + 1) * WORD] for i in range(C)])
                    stepped = Mux(single_d, word, stepped)
                m.d.comb += port.data[lane].eq(stepped)
            else:
                m.d.comb += port.data[lane].eq(words_at(Cat(*(values[p] for p in mine)), offset_d, tile.words))


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



PORT_KINDS = (ReadPort, WritePort, TileReadPort, SharedReadPort, RowWritePort, BankWritePort, SharedWritePort)
"""The kinds of buffer port a unit may ask for."""


class Buffers(wiring.Component):
    """ABUF (`abuf_words`) and WBUF (`wbuf_words`), sized from `cfg`, with the ports in `ports`: member
    name -> (Space.ABUF or Space.WBUF, one of `PORT_KINDS`), each member facing the unit that drives it.
    Write ports listed later take precedence on the same word; the SharedReadPorts of a buffer form one group,
    granted in the order listed, and its RowWritePorts, BankWritePorts and SharedWritePorts another (in that
    order, each kind in the order listed)."""

    def __init__(self, cfg: ArchConfig, ports: dict):
        self.cfg = cfg
        self.ports = dict(ports)
        for name, (space, sig) in self.ports.items():
            if space not in (Space.ABUF, Space.WBUF) or not isinstance(sig, PORT_KINDS):
                raise ValueError(f"buffer port {name!r}: {space} {sig!r} is not an ABUF/WBUF read, write or tile port")
            if isinstance(sig, (RowWritePort, BankWritePort)) and sig.chunk != cfg.buffer_chunk_words:
                raise ValueError(f"buffer port {name!r}: {sig!r} does not write the buffers' "
                                 f"{cfg.buffer_chunk_words}-word chunks")
            if isinstance(sig, BankWritePort) and sig.banks != cfg.buffer_banks:
                raise ValueError(f"buffer port {name!r}: {sig!r} does not write the buffers' {cfg.buffer_banks} memories")
        self.chunk, self.banks = cfg.buffer_chunk_words, cfg.buffer_banks
        super().__init__({name: In(sig) for name, (space, sig) in self.ports.items()})

    def banked(self, space: Space) -> BankedBuffer:
        """The BankedBuffer of `space` (Space.ABUF or Space.WBUF) with its ports, as elaborate builds it (also
        synthesised alone: scripts/synth_netlist.py --buffer)."""
        words = self.cfg.abuf_words if space == Space.ABUF else self.cfg.wbuf_words
        mine = {name: sig for name, (sp, sig) in self.ports.items() if sp == space}
        return BankedBuffer(words, chunk=self.chunk, banks=self.banks,
                            reads={n: s.words for n, s in mine.items() if isinstance(s, ReadPort)},
                            writes={n: s.words for n, s in mine.items() if isinstance(s, WritePort)},
                            tiles={n: s for n, s in mine.items() if isinstance(s, TileReadPort)},
                            shared_reads={n: s.words for n, s in mine.items() if isinstance(s, SharedReadPort)},
                            row_writes={n: s.rows for n, s in mine.items() if isinstance(s, RowWritePort)},
                            bank_writes=[n for n, s in mine.items() if isinstance(s, BankWritePort)],
                            shared_writes={n: s.words for n, s in mine.items() if isinstance(s, SharedWritePort)})

    def elaborate(self, platform):
        m = Module()
        for space in (Space.ABUF, Space.WBUF):
            m.submodules[space.name.lower()] = buf = self.banked(space)
            for name, (sp, _) in self.ports.items():
                if sp == space:
                    wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(buf, name))
        return m
