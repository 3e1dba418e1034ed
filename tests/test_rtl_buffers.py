"""hw/core/buffers.py: the chunk-banked buffer against a word array, in Amaranth's simulator.

Random reads and writes on several ports at once, at any address (chunk straddles, the last chunk of a
bank wrapping to the next row, the buffer's end, addresses past it), with random masks: every read
returns the words one cycle after its address, every write lands where en and mask say, the later write
port wins on a shared word, and nothing past the end is written (every word is read back at the end). Fails if the chunk placement, the
shift, the word enables or the row of the second chunk were wrong (each was checked by breaking it).

The word-array, tile-port and grant tests run at small geometries (8-word chunks over 2 to 5 memories, seconds)
and at the `u280` preset's own (issue 32, "safety net first": its 17 memories of 64-word chunks and its units'
port widths, from `get_config("u280")`; cases `[u280...]`, half a minute to two minutes together on the 2-core
machine, by its load): the port logic is the same code at either width, but only the u280 cases build its 17-memory
crossbars, 64-word shifts and wide masks. The u280 buffers' depths are small (a depth changes only the row address
widths, not the port logic).
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
from amaranth.sim import Simulator

from ringgpt.hw.config import get_config
from ringgpt.hw.banks import tile_read_cycles
from ringgpt.hw.core.buffers import BankedBuffer, Buffers
from ringgpt.hw.core.interfaces import ReadPort, TileReadPort
from ringgpt.hw.core.vector import VectorUnit
from ringgpt.hw.isa import Space

READS = {"r_wide": 8, "r_odd": 3, "r_one": 1}
WRITES = {"w_wide": 8, "w_odd": 5, "w_one": 1}


def _u280_geometry():
    """The u280 preset's config, its buffers' chunk (64 words) and memories (17)."""
    cfg = get_config("u280")
    return cfg, cfg.buffer_chunk_words, cfg.buffer_banks


def _bits(rng, width: int) -> int:
    """`width` random bits (masks wider than NumPy's 64-bit integers: a u280 port's 64 words)."""
    return int.from_bytes(rng.bytes(-(-width // 8)), "little") & ((1 << width) - 1)


def _simulate(buf, testbench):
    """Runs `testbench` against `buf` in Amaranth's simulator (one clock)."""
    # Amaranth's simulator writes its values into Python source as decimal literals: a 17-lane tile port's data
    # (17 x 64 x 16 bits) is past Python's 4,300-digit limit on int-to-string conversion
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        sim = Simulator(buf)
        sim.add_clock(1e-8)
        sim.add_testbench(testbench)
        sim.run()
    finally:
        sys.set_int_max_str_digits(limit)


def _address(rng, words: int, width: int, chunk: int) -> int:
    kind = rng.integers(6)
    if kind == 0:                                   # straddles a chunk boundary
        return int(rng.integers(1, words // chunk)) * chunk - int(rng.integers(1, width + 1))
    if kind == 1:                                   # at or past the end
        return words - int(rng.integers(0, 2 * width + 1))
    if kind == 2:                                   # far past the end, near the 32-bit limit
        return (1 << 32) - int(rng.integers(1, 3 * chunk))
    return int(rng.integers(0, words))


def _word_array_case(banks):
    """(chunk, banks, words, read ports, write ports, cycles, fill cycles, seed) of the word-array test: 8-word
    chunks over `banks` memories, or "u280"."""
    if banks == "u280":
        _, chunk, banks = _u280_geometry()
        return (chunk, banks, 40 * chunk, {"r_wide": chunk, "r_odd": 37, "r_one": 1},
                {"w_wide": chunk, "w_odd": 41, "w_one": 1}, 160, 46, 17)
    return 8, banks, 256, READS, WRITES, 400, 32, banks


@pytest.mark.parametrize("banks", [2, 4, 5, "u280"])
def test_banked_buffer_matches_a_word_array(banks):
    """Three read ports and three write ports (the module docstring) over 32 chunks of 8 words in 2, 4 or 5
    memories (ports of 8, 3 and 1 words read, 8, 5 and 1 written; 400 cycles), and at u280's geometry over 40
    chunks of 64 words in its 17 memories (ports of 64, 37 and 1 words read, 64, 41 and 1 written; the last row of
    the memories partial, memory 16's chunk wrapping to memory 0's next row; 160 cycles, as each costs far more).
    The first cycles write every chunk whole (the fill: the reads see written words), then the writes go to any
    address with random masks half the time."""
    chunk, banks, words, reads, writes, cycles, fill, seed = _word_array_case(banks)
    buf = BankedBuffer(words, chunk=chunk, banks=banks, reads=reads, writes=writes)
    rng = np.random.default_rng(seed)
    model = np.zeros(words, dtype=np.int64)
    wrong = []

    async def testbench(ctx):
        for cycle in range(cycles):
            addrs = {name: _address(rng, words, width, chunk) for name, width in reads.items()}
            for name, addr in addrs.items():
                ctx.set(getattr(buf, name).addr, addr)
            landed = {}
            for name, width in writes.items():
                port, filling = getattr(buf, name), cycle < fill
                en = filling or rng.random() < 0.7      # fill first, then mix
                addr = cycle * chunk % words if filling else _address(rng, words, width, chunk)
                mask = _bits(rng, width) if rng.random() < 0.5 and not filling else (1 << width) - 1
                values = [int(v) for v in rng.integers(0, 1 << 16, width)]
                for member, value in (("en", en), ("addr", addr), ("mask", mask), ("data", values)):
                    ctx.set(getattr(port, member), value)
                if en:
                    landed[name] = (addr, mask, values)
            await ctx.tick()
            for name, addr in addrs.items():            # the words before this cycle's writes
                if addr + reads[name] <= words:
                    got = [int(v) for v in ctx.get(getattr(buf, name).data)]
                    expected = [int(v) for v in model[addr:addr + reads[name]]]
                    if got != expected:
                        wrong.append((cycle, name, addr, got, expected))
            for name in writes:                         # later ports win: apply in order
                if name in landed:
                    addr, mask, values = landed[name]
                    for i, value in enumerate(values):
                        if mask >> i & 1 and addr + i < words:
                            model[addr + i] = value
        for name in writes:
            ctx.set(getattr(buf, name).en, 0)
        for addr in range(0, words, reads["r_wide"]):   # then every word
            ctx.set(buf.r_wide.addr, addr)
            await ctx.tick()
            got = [int(v) for v in ctx.get(buf.r_wide.data)]
            expected = [int(v) for v in model[addr:addr + reads["r_wide"]]]
            if got != expected:
                wrong.append(("dump", addr, got, expected))

    _simulate(buf, testbench)
    assert not wrong, wrong[:3]


def test_banked_buffer_refuses_bad_geometry():
    with pytest.raises(ValueError, match="power of two"):
        BankedBuffer(256, chunk=6, banks=3, reads={}, writes={})
    with pytest.raises(ValueError, match="at least 2"):
        BankedBuffer(256, chunk=8, banks=1, reads={}, writes={})
    with pytest.raises(ValueError, match="do not split"):
        BankedBuffer(204, chunk=8, banks=2, reads={}, writes={})
    with pytest.raises(ValueError, match="chunk"):
        BankedBuffer(256, chunk=8, banks=2, reads={"r": 9}, writes={})


async def _fill(ctx, port, model, chunk: int) -> int:
    """Writes `model` into the buffer through write port `port`, a chunk a cycle; returns the cycles taken."""
    for addr in range(0, len(model), chunk):
        ctx.set(port.en, 1)
        ctx.set(port.addr, addr)
        ctx.set(port.mask, (1 << chunk) - 1)
        ctx.set(port.data, [int(v) for v in model[addr:addr + chunk]])
        await ctx.tick()
    ctx.set(port.en, 0)
    return len(model) // chunk


def _tile_case(port):
    """(chunk, banks, words, the tile port, requests, seed, the cycles the slowest request reaches at least) of the
    tile port test: `port` is (lane words, aligned lanes[, scalar lanes]) of a 4-lane port over 5 memories of 8-word chunks, its last
    lane 3 words wide (as a bias lane), or a u280 unit's port over its 17 memories of 64-word chunks (4 periods of
    them): the matrix unit's WBUF port ("u280-matrix_wbuf": 16 aligned weight lanes of 64 words and the bias lane of
    16 words at any address) or the vector unit's ABUF port ("u280-vector_abuf": 3 lanes of 64 words stepped by 16,
    single at any word). The small port's slowest request has all 4 lanes in one memory; the u280 ports reach 3 cycles (the
    matrix port's 17 lanes a period apart would run past the buffer, so its stride becomes one chunk)."""
    if isinstance(port, tuple):
        lane_words, aligned, *scalars = port
        return (8, 5, 512, TileReadPort(4, lane_words, (lane_words,) * 3 + (3,), aligned, *scalars), 300, 7,
                4 if not scalars else 3)
    cfg, chunk, banks = _u280_geometry()
    if port == "u280-matrix_wbuf":
        tile = TileReadPort(cfg.mpu_lanes + 1, chunk, (chunk,) * cfg.mpu_lanes + (cfg.mpu_lanes,),
                            aligned=(True,) * cfg.mpu_lanes + (False,))
    else:
        tile = VectorUnit(cfg).buffer_ports["abuf_src"][1]
    return chunk, banks, 4 * banks * chunk, tile, 120, 29, 3


@pytest.mark.parametrize("port", [pytest.param((8, (False,) * 4), id="8-unaligned"),
                                  pytest.param((8, (True, True, False, False)), id="8-two_aligned"),
                                  pytest.param((4, (True, True, True, False)), id="4-three_aligned"),
                                  pytest.param((8, (2, 2, 2, False), (False, True, True, False)), id="8-stepped"),
                                  "u280-matrix_wbuf", "u280-vector_abuf"])
def test_tile_port_reads_every_lane_in_the_counted_cycles(port):
    """A TileReadPort (`_tile_case`): 4 lanes of 8 or 4 words over 5 memories of 8-word chunks, 300 requests; and
    the ports the u280 units use over 17 memories of 64-word chunks, 120 requests (each costs far more): lane
    addresses a stride apart (0, one chunk, a multiple of the memories' chunks: all in one memory, unaligned; a
    stride that would run past the buffer becomes one chunk) or at random, random lane enables and `single` lanes
    (one word wanted, on any lane), the small and matrix ports' last lane narrower (a bias lane); `aligned` lanes'
    addresses rounded down to a multiple of their step (a 4-word aligned lane is either half of its chunk; a lane
    stepped by 2 words, as the vector unit's by special_lanes, wants the words from there to its chunk's end, or,
    single on a scalar lane, one word anywhere); the
    request is held until `ready`, the cycles it took equal tile_read_cycles (a single lane reading 1 word), and
    every enabled lane's wanted words arrive the cycle after and stay while the addresses are held with no lane
    enabled; a lane that keeps its last address and `single`, not enabled, gives its words again (read by neither
    the request nor its cycles). Fails if a part were served from the wrong row or bank, the second chunk skipped,
    `single` ignored, `ready` raised early, or an aligned lane given the wrong half of its row (each was checked by
    breaking it, at 8-word chunks)."""
    chunk, banks, words, tile, requests, seed, slowest = _tile_case(port)
    lanes, widths, steps, scalars = tile.lanes, np.array(tile.widths), np.array(tile.aligned), np.array(tile.scalars)
    buf = BankedBuffer(words, chunk=chunk, banks=banks, reads={}, writes={"fill": chunk}, tiles={"tile": tile})
    rng = np.random.default_rng(seed)
    model = rng.integers(0, 1 << 16, words)
    wrong, counted = [], []

    def request():
        kind = rng.integers(5)
        if kind == 4:
            starts = rng.integers(0, words - chunk, lanes)
        else:
            stride = [0, chunk, banks * chunk, int(rng.integers(1, 3 * chunk))][kind]
            if (lanes - 1) * stride > words - 2 * chunk:
                stride = chunk
            base = int(rng.integers(0, words - chunk - (lanes - 1) * stride))
            starts = base + stride * np.arange(lanes)
        single = rng.random(lanes) < 0.25
        step = np.maximum(steps, 1)
        starts = np.where((steps > 0) & ~(single & scalars), starts // step * step, starts)
        return starts, rng.random(lanes) < 0.85, single

    async def testbench(ctx):
        await _fill(ctx, buf.fill, model, chunk)
        last = None         # the previous request: a lane may keep its address, not enabled, and its rows
        for _ in range(requests):
            starts, enabled, single = request()
            kept = np.zeros(lanes, bool)
            if last is not None and rng.random() < 0.4:
                kept = (rng.random(lanes) < 0.5) & last[3]
                starts, single = np.where(kept, last[0], starts), np.where(kept, last[2], single)
                enabled = enabled & ~kept
            ctx.set(buf.tile.addr, [int(a) for a in starts])
            ctx.set(buf.tile.en, int(sum(int(e) << lane for lane, e in enumerate(enabled))))
            ctx.set(buf.tile.single, int(sum(int(e) << lane for lane, e in enumerate(single))))
            cycles = 1
            while not ctx.get(buf.tile.ready):
                await ctx.tick()
                cycles += 1
            await ctx.tick()
            ctx.set(buf.tile.en, 0)
            for _ in range(int(rng.integers(3))):     # the data stay while the addresses are held
                await ctx.tick()
            # an aligned lane's words end with its one chunk
            wanted = np.where(single, 1, np.where(steps > 0, np.minimum(widths, chunk - starts % chunk), widths))
            expected_cycles = int(tile_read_cycles(starts, enabled, wanted, chunk, banks))
            counted.append(cycles)
            if cycles != expected_cycles:
                wrong.append(("cycles", list(starts), list(enabled), cycles, expected_cycles))
            data = ctx.get(buf.tile.data)
            last = (starts, enabled, single, enabled | kept)
            for lane in range(lanes):
                if enabled[lane] or kept[lane]:
                    got = [int(v) for v in data[lane]][:wanted[lane]]
                    if got != [int(v) for v in model[starts[lane]:starts[lane] + wanted[lane]]]:
                        wrong.append(("data", list(starts), lane, got))

    _simulate(buf, testbench)
    assert not wrong, wrong[:3]
    assert max(counted) >= slowest and min(counted) == 1   # the cases reached both ends


SHARED_READS = {"s_wide": 8, "s_odd": 3, "s_beat": 8}
ROW_WRITES = {"w_first": 2, "w_second": 1, "w_third": 2}
SHARED_WRITES = {"sw_wide": 8, "sw_odd": 3}


def _granted(touches: list, urgent: list) -> list:
    """The grants of a group: the urgent requesters first, then the others, each in order; a requester is ready
    when no requester granted before it took one of its memories."""
    taken, ready = set(), [False] * len(touches)
    for first in (True, False):
        for k, touch in enumerate(touches):
            if urgent[k] == first:
                ready[k] = not touch & taken
                if ready[k]:
                    taken |= touch
    return ready


def _write_granted(lane_touches: list, lane_urgent: list, unit_touches: list, unit_asks: list, unit_urgent: list):
    """The write group's grants: the row and shared writes (`unit_*`, in order) take turns for the one unit write,
    the first asking (the urgent ones first) chosen, then the engine rows (`lane_*`) and the unit write are granted as
    `_granted` says, the unit write last. Returns the lanes' ready and the unit writes' (not asking: ready)."""
    pool = [k for k, ask in enumerate(unit_asks) if ask and unit_urgent[k]] or [k for k, ask in enumerate(unit_asks) if ask]
    chosen = pool[0] if pool else None
    ready = _granted(lane_touches + [unit_touches[chosen] if pool else set()],
                     lane_urgent + [bool(pool) and unit_urgent[chosen]])
    return ready[:-1], [not ask or (k == chosen and ready[-1]) for k, ask in enumerate(unit_asks)]


def _grant_case(banks):
    """(chunk, banks, words, shared reads, shared writes, cycles, seed, least refused and granted) of the grant test:
    8-word chunks over `banks` memories, or "u280": its 17 memories of 64-word chunks, the shared reads of 64 and
    37 words and a 32-word HBM beat, the shared writes of 64 and 37 words, 150 cycles (each costs far more)."""
    if banks == "u280":
        _, chunk, banks = _u280_geometry()
        return (chunk, banks, 3 * banks * chunk, {"s_wide": chunk, "s_odd": 37, "s_beat": 32},
                {"sw_wide": chunk, "sw_odd": 37}, 150, 41, (40, 150))
    return 8, banks, 256, SHARED_READS, SHARED_WRITES, 500, banks + 10, (50, 200)


@pytest.mark.parametrize("banks", [2, 5, "u280"])
def test_shared_ports_grant_in_priority_order(banks):
    """Over 32 chunks of 8 words in 2 or 5 memories (500 cycles), and at u280's geometry over 51 chunks of 64 words
    in its 17 memories (150 cycles; its units' widths, `_grant_case`): three SharedReadPorts, and three
    RowWritePorts (of two, one and two chunks), a BankWritePort (a row per memory, each its own requester: the DMA
    engines' crossbar) and two SharedWritePorts, over one read and one write port per memory: random requests (often
    several on one memory; a shared write claims its whole window, mask or not), some urgent, against a word array;
    `ready` is exactly the grant (reads: no requester granted before it, urgent ones first, on one of the memories
    it touches; writes: the row and shared writes take turns for one unit write, granted after the engine rows,
    `_write_granted`), every granted read returns its words the cycle after, every granted row write lands (word
    enables, both chunks, nothing past the end) and nothing else does; every word is read back at the end. Fails if
    a memory served the wrong requester or row, a chunk were placed in the wrong memory, or an ungranted write
    landed (each was checked by breaking it)."""
    chunk, banks, words, shared_reads, shared_writes, cycles, seed, least = _grant_case(banks)
    chunks = words // chunk
    held = -(-chunks // banks)                      # rows a memory holds
    lanes = [f"bank_write{b}" for b in range(banks)]
    buf = BankedBuffer(words, chunk=chunk, banks=banks, reads={"check": chunk}, writes={},
                       shared_reads=shared_reads, row_writes=ROW_WRITES, bank_writes=["bank_write"],
                       shared_writes=shared_writes)
    write_names = [*ROW_WRITES, *lanes, *shared_writes]
    rng = np.random.default_rng(seed)
    model = np.zeros(words, dtype=np.int64)
    wrong, grants = [], {"read": [0, 0], "write": [0, 0]}

    async def testbench(ctx):
        for cycle in range(cycles):
            hot = int(rng.integers(0, chunks))          # requests cluster on a few chunks, so they collide
            read_touch, reads = [], {}
            for name, width in shared_reads.items():
                port, en = getattr(buf, name), bool(rng.random() < 0.8)
                addr = (hot * chunk + int(rng.integers(-chunk, 2 * chunk))) % words if rng.random() < 0.6 else \
                    _address(rng, words, width, chunk)
                ctx.set(port.en, en)
                ctx.set(port.addr, addr)
                reads[name] = addr
                read_touch.append({c % banks for c in {addr // chunk, (addr + width - 1) // chunk}}
                                  if en else set())
            write_touch, writes, unit_asks = [], {}, {}
            for name, rows in ROW_WRITES.items():
                port, en = getattr(buf, name), bool(rng.random() < 0.8 and cycle > 3)
                first = (hot + int(rng.integers(-1, 2))) % chunks if rng.random() < 0.6 else \
                    int(rng.choice([rng.integers(0, chunks), chunks - 1, chunks]))
                mask = _bits(rng, rows * chunk) if rng.random() < 0.7 else \
                    [(1 << chunk) - 1, ((1 << chunk) - 1) << chunk, 0][int(rng.integers(3))] & ((1 << rows * chunk) - 1)
                values = [int(v) for v in rng.integers(0, 1 << 16, rows * chunk)]
                ctx.set(port.en, en)
                unit_asks[name] = en
                ctx.set(port.first, first)
                ctx.set(port.mask, mask)
                ctx.set(port.data, values)
                writes[name] = (first, mask, values)
                write_touch.append({(first + h) % banks for h in range(rows) if mask >> (h * chunk) & ((1 << chunk) - 1)}
                                   if en else set())
            lane_en, lane_rows, lane_masks, lane_values = 0, [], [], []
            for b, name in enumerate(lanes):                # a row of memory b: chunk row * banks + b
                en = bool(rng.random() < 0.6 and cycle > 3)
                row = (hot // banks + int(rng.integers(-1, 2))) % held if rng.random() < 0.6 else \
                    int(rng.choice([rng.integers(0, held), held - 1, held]))
                mask = _bits(rng, chunk)
                values = [int(v) for v in rng.integers(0, 1 << 16, chunk)]
                lane_en |= en << b
                lane_rows.append(row)
                lane_masks.append(mask)
                lane_values.append(values)
                writes[name] = (row * banks + b, mask, values)
                write_touch.append({b} if en else set())
            for member, value in (("en", lane_en), ("row", lane_rows), ("mask", lane_masks), ("data", lane_values)):
                ctx.set(getattr(buf.bank_write, member), value)
            for name, width in shared_writes.items():       # the words at any address; they claim their window
                port, en = getattr(buf, name), bool(rng.random() < 0.6 and cycle > 3)
                addr = (hot * chunk + int(rng.integers(-chunk, 2 * chunk))) % words if rng.random() < 0.6 else \
                    _address(rng, words, width, chunk)
                mask = _bits(rng, width)
                values = [int(v) for v in rng.integers(0, 1 << 16, width)]
                ctx.set(port.en, en)
                unit_asks[name] = en
                ctx.set(port.addr, addr)
                ctx.set(port.mask, mask)
                ctx.set(port.data, values)
                writes[name] = (addr // chunk, (mask << addr % chunk), [0] * (addr % chunk) + values)
                write_touch.append({c % banks for c in {addr // chunk, (addr + width - 1) // chunk}} if en else set())
            urgent = {name: bool(rng.random() < 0.3) for name in [*shared_reads, *write_names]}
            for name, value in urgent.items():
                if name not in lanes:
                    ctx.set(getattr(buf, name).urgent, value)
            ctx.set(buf.bank_write.urgent, sum(urgent[name] << b for b, name in enumerate(lanes)))
            read_ready = _granted(read_touch, [urgent[name] for name in shared_reads])
            unit_names = [*ROW_WRITES, *shared_writes]
            lane_ready, unit_ready = _write_granted(
                [write_touch[write_names.index(n)] for n in lanes], [urgent[n] for n in lanes],
                [write_touch[write_names.index(n)] for n in unit_names], [unit_asks[n] for n in unit_names],
                [urgent[n] for n in unit_names])
            write_ready = [lane_ready[lanes.index(n)] if n in lanes else unit_ready[unit_names.index(n)]
                           for n in write_names]
            lane_bits = ctx.get(buf.bank_write.ready)
            for kind, names, expected, touches in (("read", shared_reads, read_ready, read_touch),
                                                   ("write", write_names, write_ready, write_touch)):
                for name, ready, touch in zip(names, expected, touches):
                    got = bool(lane_bits >> lanes.index(name) & 1 if name in lanes else ctx.get(getattr(buf, name).ready))
                    if got != ready:
                        wrong.append((cycle, name, "ready", got, ready))
                    if touch:
                        grants[kind][ready] += 1
            await ctx.tick()
            for (name, width), ready, touch in zip(shared_reads.items(), read_ready, read_touch):
                addr = reads[name]
                if touch and ready and addr + width <= words:   # the words before this cycle's writes
                    got = [int(v) for v in ctx.get(getattr(buf, name).data)]
                    if got != [int(v) for v in model[addr:addr + width]]:
                        wrong.append((cycle, name, addr, got))
            for name, ready, touch in zip(write_names, write_ready, write_touch):
                first, mask, values = writes[name]
                if touch and ready:
                    for i, value in enumerate(values):
                        if mask >> i & 1 and first * chunk + i < words:
                            model[first * chunk + i] = value
        for name in [*shared_reads, *ROW_WRITES, "bank_write", *shared_writes]:
            ctx.set(getattr(buf, name).en, 0)
        for addr in range(0, words, chunk):             # then every word
            ctx.set(buf.check.addr, addr)
            await ctx.tick()
            got = [int(v) for v in ctx.get(buf.check.data)]
            if got != [int(v) for v in model[addr:addr + chunk]]:
                wrong.append(("dump", addr, got))

    _simulate(buf, testbench)
    assert not wrong, wrong[:3]
    for kind, (refused, granted) in grants.items():     # both outcomes happened often
        assert refused > least[0] and granted > least[1], (kind, refused, granted)


def test_tile_ports_and_shared_reads_share_one_read_port_per_memory():
    """Two TileReadPorts and two SharedReadPorts over one read port per memory, cycle by cycle against a model
    of the arbitration: each memory serves the shared group's grant first (`_granted`), else the tile port
    whose turn it is (the turn alternates every cycle), else the other, each tile port its lowest-numbered
    pending part there; a tile port's `ready` rises exactly when its last part is served, and every granted
    read returns its words (tile lanes the cycle after `ready`). Random requests cluster on a few chunks, so
    they collide. Fails if a tile port read a memory the group or the other port holds, kept a part that was
    not served, or lost the turn order (each was checked by breaking it)."""
    words, chunk, banks = 512, 8, 5
    tiles = {"ta": TileReadPort(3, chunk), "tb": TileReadPort(2, chunk)}
    shared = {"s0": chunk, "s1": 3}
    buf = BankedBuffer(words, chunk=chunk, banks=banks, reads={}, writes={"fill": chunk}, tiles=tiles,
                       shared_reads=shared)
    rng = np.random.default_rng(11)
    model = rng.integers(0, 1 << 16, words)
    wrong, outcomes = [], {"tile waits": 0, "tiles ready": 0, "shared refused": 0, "shared granted": 0}

    def parts_of(starts, enabled, single):          # part 2l: lane l's first chunk, 2l + 1: its next one
        parts = []
        for start, en, one in zip(starts, enabled, single):
            parts.append(start // chunk if en else None)
            parts.append(start // chunk + 1 if en and not one and start % chunk else None)
        return parts

    async def testbench(ctx):
        cycle = await _fill(ctx, buf.fill, model, chunk)
        requests = {name: None for name in tiles}   # name -> (starts, enabled, single, pending parts)
        for _ in range(600):
            hot = int(rng.integers(0, words // chunk - 2))
            for name, tile in tiles.items():
                if requests[name] is None:
                    starts = [(hot * chunk + int(rng.integers(-chunk, 3 * chunk))) % (words - chunk)
                              if rng.random() < 0.7 else int(rng.integers(0, words - chunk)) for _ in range(tile.lanes)]
                    enabled, single = list(rng.random(tile.lanes) < 0.9), list(rng.random(tile.lanes) < 0.2)
                    parts = parts_of(starts, enabled, single)
                    requests[name] = (starts, enabled, single, {p for p, c in enumerate(parts) if c is not None}, parts)
                    ctx.set(getattr(buf, name).addr, starts)
                    ctx.set(getattr(buf, name).en, sum(int(e) << lane for lane, e in enumerate(enabled)))
                    ctx.set(getattr(buf, name).single, sum(int(e) << lane for lane, e in enumerate(single)))
            touches, reads, urgent = [], {}, []
            for name, width in shared.items():
                port, en = getattr(buf, name), bool(rng.random() < 0.5)
                addr = (hot * chunk + int(rng.integers(-chunk, 2 * chunk))) % (words - chunk)
                urgent.append(bool(rng.random() < 0.3))
                ctx.set(port.en, en)
                ctx.set(port.addr, addr)
                ctx.set(port.urgent, urgent[-1])
                reads[name] = addr
                touches.append({c % banks for c in {addr // chunk, (addr + width - 1) // chunk}} if en else set())
            granted = _granted(touches, urgent)
            taken = set().union(*(t for t, g in zip(touches, granted) if g))
            names = list(tiles) if cycle % 2 == 0 else list(tiles)[::-1]
            ready = {}
            for name in names:
                *_, pending, parts = requests[name]
                for b in range(banks):
                    mine = sorted(p for p in pending if parts[p] % banks == b)
                    if mine and b not in taken:
                        taken.add(b)
                        pending -= {p for p in mine if parts[p] == parts[mine[0]]}
                ready[name] = not pending
            for name in tiles:
                got = bool(ctx.get(getattr(buf, name).ready))
                if got != ready[name]:
                    wrong.append((cycle, name, "ready", got, ready[name]))
                outcomes["tiles ready" if ready[name] else "tile waits"] += 1
            for name, expected in zip(shared, granted):
                if bool(ctx.get(getattr(buf, name).ready)) != expected:
                    wrong.append((cycle, name, "ready", expected))
            await ctx.tick()
            cycle += 1
            for (name, width), expected, touch in zip(shared.items(), granted, touches):
                if touch:
                    outcomes["shared granted" if expected else "shared refused"] += 1
                if touch and expected:
                    got = [int(v) for v in ctx.get(getattr(buf, name).data)]
                    if got != [int(v) for v in model[reads[name]:reads[name] + width]]:
                        wrong.append((cycle, name, "data", got))
            for name, tile in tiles.items():
                if ready[name]:
                    starts, enabled, single, _, _ = requests[name]
                    data = ctx.get(getattr(buf, name).data)
                    for lane in range(tile.lanes):
                        wanted = 1 if single[lane] else chunk
                        got = [int(v) for v in data[lane]][:wanted]
                        if enabled[lane] and got != [int(v) for v in model[starts[lane]:starts[lane] + wanted]]:
                            wrong.append((cycle, name, lane, "data", got))
                    requests[name] = None

    _simulate(buf, testbench)
    assert not wrong, wrong[:3]
    assert min(outcomes.values()) > 50, outcomes    # every outcome happened often


def test_tile_read_cycles_counts_distinct_chunks_per_bank():
    starts = np.array([[0, 8, 16, 24], [0, 40, 80, 120], [3, 3, 3, 3], [4, 44, 0, 0]])
    enabled = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]], bool)
    # aligned one chunk apart: 4 banks; 5 chunks apart: one bank, 4 chunks; one unaligned address:
    # chunks 0 and 1 once; chunks 0, 1, 5, 6: banks 0 and 1 twice each
    assert list(tile_read_cycles(starts, enabled, 8, 8, 5)) == [1, 4, 1, 2]
    assert tile_read_cycles(starts[0], np.zeros(4, bool), 8, 8, 5) == 1


@pytest.mark.parametrize("preset", ["sim-small", "u280"])
def test_geometry_follows_the_config(preset):
    cfg = get_config(preset)
    assert cfg.buffer_chunk_words == max(cfg.mac_width, cfg.vector_width, cfg.hbm_port_bits // 16)
    assert cfg.buffer_banks == {"sim-small": 5, "u280": 17}[preset]
    buffers = Buffers(cfg, {"x": (Space.ABUF, ReadPort(cfg.vector_width)),
                            "w": (Space.WBUF, TileReadPort(cfg.mpu_lanes, cfg.mac_width))})
    buffers._MustUse__silence = True
    assert (buffers.chunk, buffers.banks) == (cfg.buffer_chunk_words, cfg.buffer_banks)


def test_buffer_memories_map_to_ultraram(tmp_path):
    """Yosys synth_xilinx maps a buffer's memories to URAM288 (its `ram_style`), none to block RAM: WBUF at u280 is as
    large as all of the U280's block RAM. Two memories of 8-word rows, each one URAM288 wide (128 bits: two)."""
    from amaranth.back import rtlil
    from ringgpt.hw import netlist
    buffer = BankedBuffer(2 * 8 * 64, chunk=8, banks=2, reads={"r": 8}, writes={"w": 8})
    cells, _ = netlist.synthesise_module(rtlil.convert(buffer, name="top", emit_src=False), tmp_path,
                                         netlist.yosys_command()[0])
    found = netlist.figures(cells)
    assert (found["URAM"], found["BRAM36"]) == (2 * 2, 0), found
