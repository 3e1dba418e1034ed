"""hw/core/buffers.py: the chunk-banked buffer against a word array, in Amaranth's simulator.

Random reads and writes on several ports at once, at any address (chunk straddles, the last chunk of a
bank wrapping to the next row, the buffer's end, addresses past it), with random masks: every read
returns the words one cycle after its address, every write lands where en and mask say, the later write
port wins on a shared word, and nothing past the end is written (every word is read back at the end). Fails if the chunk placement, the
shift, the word enables or the row of the second chunk were wrong (each was checked by breaking it).
"""
from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from ringgpt.hw.config import get_config
from ringgpt.hw.banks import tile_read_cycles
from ringgpt.hw.core.buffers import BankedBuffer, Buffers
from ringgpt.hw.core.interfaces import ReadPort, TileReadPort
from ringgpt.hw.isa import Space

READS = {"r_wide": 8, "r_odd": 3, "r_one": 1}
WRITES = {"w_wide": 8, "w_odd": 5, "w_one": 1}


def _address(rng, words: int, width: int, chunk: int) -> int:
    kind = rng.integers(6)
    if kind == 0:                                   # straddles a chunk boundary
        return int(rng.integers(1, words // chunk)) * chunk - int(rng.integers(1, width + 1))
    if kind == 1:                                   # at or past the end
        return words - int(rng.integers(0, 2 * width + 1))
    if kind == 2:                                   # far past the end, near the 32-bit limit
        return (1 << 32) - int(rng.integers(1, 3 * chunk))
    return int(rng.integers(0, words))


@pytest.mark.parametrize("banks", [2, 4, 5])
def test_banked_buffer_matches_a_word_array(banks):
    words, chunk, cycles = 256, 8, 400
    buf = BankedBuffer(words, chunk=chunk, banks=banks, reads=READS, writes=WRITES)
    rng = np.random.default_rng(banks)
    model = np.zeros(words, dtype=np.int64)
    wrong = []

    async def testbench(ctx):
        for cycle in range(cycles):
            reads = {name: _address(rng, words, width, chunk) for name, width in READS.items()}
            for name, addr in reads.items():
                ctx.set(getattr(buf, name).addr, addr)
            writes = {}
            for name, width in WRITES.items():
                port = getattr(buf, name)
                en = cycle > 20 and rng.random() < 0.7  # fill first, then mix
                addr = _address(rng, words, width, chunk) if cycle > 20 else int(rng.integers(0, words))
                mask = int(rng.integers(0, 1 << width)) if rng.random() < 0.5 else (1 << width) - 1
                values = [int(v) for v in rng.integers(0, 1 << 16, width)]
                ctx.set(port.en, en)
                ctx.set(port.addr, addr)
                ctx.set(port.mask, mask)
                ctx.set(port.data, values)
                if en:
                    writes[name] = (addr, mask, values)
            await ctx.tick()
            for name, addr in reads.items():        # the words before this cycle's writes
                if addr + READS[name] <= words:
                    got = list(ctx.get(getattr(buf, name).data))
                    expected = [int(model[addr + i]) for i in range(READS[name])]
                    if got != expected:
                        wrong.append((cycle, name, addr, got, expected))
            for name in WRITES:                     # later ports win: apply in order
                if name in writes:
                    addr, mask, values = writes[name]
                    for i, value in enumerate(values):
                        if mask >> i & 1 and addr + i < words:
                            model[addr + i] = value
        ctx.set(buf.w_wide.en, 0)
        ctx.set(buf.w_odd.en, 0)
        ctx.set(buf.w_one.en, 0)
        for addr in range(0, words, READS["r_wide"]):   # then every word
            ctx.set(buf.r_wide.addr, addr)
            await ctx.tick()
            got = list(ctx.get(buf.r_wide.data))
            expected = [int(v) for v in model[addr:addr + READS["r_wide"]]]
            if got != expected:
                wrong.append(("dump", addr, got, expected))

    sim = Simulator(buf)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
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


@pytest.mark.parametrize("lane_words, aligned", [(8, (False,) * 4), (8, (True, True, False, False)),
                                                 (4, (True, True, True, False))])
def test_tile_port_reads_every_lane_in_the_counted_cycles(lane_words, aligned):
    """A TileReadPort of 4 lanes x `lane_words` words over 5 banks of 8-word chunks: lane addresses a stride apart
    (0, one chunk, a multiple of the banks' chunks: all in one bank, unaligned) or at random, random lane enables
    and `single` lanes (one word wanted), one lane 3 words wide; `aligned` lanes' addresses rounded down to a
    multiple of lane_words (a 4-word aligned lane is either half of its chunk); the request is held until `ready`,
    the cycles it took equal tile_read_cycles (a single lane reading 1 word), and every enabled lane's wanted words
    arrive the cycle after and stay while the addresses are held with no lane enabled; a lane that keeps its last
    address and `single`, not enabled, gives its words again (read by neither the request nor its cycles). Fails
    if a part were served from the wrong row or bank, the second chunk skipped, `single` ignored, `ready` raised
    early, or an aligned lane given the wrong half of its row (each was checked by breaking it)."""
    words, chunk, banks, lanes = 512, 8, 5, 4
    widths = np.array([lane_words, lane_words, lane_words, 3])   # the last lane needs 3 words (as a bias lane)
    buf = BankedBuffer(words, chunk=chunk, banks=banks, reads={}, writes={"fill": chunk},
                       tiles={"tile": TileReadPort(lanes, lane_words, tuple(int(w) for w in widths), aligned)})
    rng = np.random.default_rng(7)
    model = rng.integers(0, 1 << 16, words)
    wrong, counted = [], []

    def request():
        kind = rng.integers(5)
        if kind == 4:
            starts = rng.integers(0, words - chunk, lanes)
        else:
            stride = [0, chunk, banks * chunk, int(rng.integers(1, 3 * chunk))][kind]
            base = int(rng.integers(0, words - chunk - (lanes - 1) * stride))
            starts = base + stride * np.arange(lanes)
        starts = np.where(aligned, starts // lane_words * lane_words, starts)
        return starts, rng.random(lanes) < 0.85, rng.random(lanes) < 0.25

    async def testbench(ctx):
        await _fill(ctx, buf.fill, model, chunk)
        last = None         # the previous request: a lane may keep its address, not enabled, and its rows
        for _ in range(300):
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
            expected_cycles = int(tile_read_cycles(starts, enabled, np.where(single, 1, widths), chunk, banks))
            counted.append(cycles)
            if cycles != expected_cycles:
                wrong.append(("cycles", list(starts), list(enabled), cycles, expected_cycles))
            data = ctx.get(buf.tile.data)
            last = (starts, enabled, single, enabled | kept)
            for lane in range(lanes):
                if enabled[lane] or kept[lane]:
                    wanted = 1 if single[lane] else widths[lane]
                    got = [int(v) for v in data[lane]][:wanted]
                    if got != [int(v) for v in model[starts[lane]:starts[lane] + wanted]]:
                        wrong.append(("data", list(starts), lane, got))

    sim = Simulator(buf)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert not wrong, wrong[:3]
    assert max(counted) >= lanes and min(counted) == 1     # the cases reached both ends


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


@pytest.mark.parametrize("banks", [2, 5])
def test_shared_ports_grant_in_priority_order(banks):
    """Three SharedReadPorts, and three RowWritePorts (of two, one and two chunks), a BankWritePort (a row per
    memory, each its own requester) and two SharedWritePorts, over one read and one write port per memory: random
    requests (often several on one memory; a shared write claims its whole window, mask or not), some urgent,
    against a word array; `ready` is exactly the grant (reads: no requester granted before it, urgent ones first,
    on one of the memories it touches; writes: the row and shared writes take turns for one unit write, granted
    after the engine rows, `_write_granted`), every granted read returns its
    words the cycle after, every granted row write lands (word enables, both chunks, nothing past the end) and
    nothing else does; every word is read back at the end. Fails if a memory served the wrong requester or row,
    a chunk were placed in the wrong memory, or an ungranted write landed (each was checked by breaking it)."""
    words, chunk, cycles = 256, 8, 500
    chunks = words // chunk
    held = -(-chunks // banks)                      # rows a memory holds
    lanes = [f"bank_write{b}" for b in range(banks)]
    buf = BankedBuffer(words, chunk=chunk, banks=banks, reads={"check": chunk}, writes={},
                       shared_reads=SHARED_READS, row_writes=ROW_WRITES, bank_writes=["bank_write"],
                       shared_writes=SHARED_WRITES)
    write_names = [*ROW_WRITES, *lanes, *SHARED_WRITES]
    rng = np.random.default_rng(banks + 10)
    model = np.zeros(words, dtype=np.int64)
    wrong, grants = [], {"read": [0, 0], "write": [0, 0]}

    async def testbench(ctx):
        for cycle in range(cycles):
            hot = int(rng.integers(0, chunks))          # requests cluster on a few chunks, so they collide
            read_touch, reads = [], {}
            for name, width in SHARED_READS.items():
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
                mask = int(rng.integers(0, 1 << rows * chunk)) if rng.random() < 0.7 else \
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
                mask = int(rng.integers(0, 1 << chunk))
                values = [int(v) for v in rng.integers(0, 1 << 16, chunk)]
                lane_en |= en << b
                lane_rows.append(row)
                lane_masks.append(mask)
                lane_values.append(values)
                writes[name] = (row * banks + b, mask, values)
                write_touch.append({b} if en else set())
            for member, value in (("en", lane_en), ("row", lane_rows), ("mask", lane_masks), ("data", lane_values)):
                ctx.set(getattr(buf.bank_write, member), value)
            for name, width in SHARED_WRITES.items():       # the words at any address; they claim their window
                port, en = getattr(buf, name), bool(rng.random() < 0.6 and cycle > 3)
                addr = (hot * chunk + int(rng.integers(-chunk, 2 * chunk))) % words if rng.random() < 0.6 else \
                    _address(rng, words, width, chunk)
                mask = int(rng.integers(0, 1 << width))
                values = [int(v) for v in rng.integers(0, 1 << 16, width)]
                ctx.set(port.en, en)
                unit_asks[name] = en
                ctx.set(port.addr, addr)
                ctx.set(port.mask, mask)
                ctx.set(port.data, values)
                writes[name] = (addr // chunk, (mask << addr % chunk), [0] * (addr % chunk) + values)
                write_touch.append({c % banks for c in {addr // chunk, (addr + width - 1) // chunk}} if en else set())
            urgent = {name: bool(rng.random() < 0.3) for name in [*SHARED_READS, *write_names]}
            for name, value in urgent.items():
                if name not in lanes:
                    ctx.set(getattr(buf, name).urgent, value)
            ctx.set(buf.bank_write.urgent, sum(urgent[name] << b for b, name in enumerate(lanes)))
            read_ready = _granted(read_touch, [urgent[name] for name in SHARED_READS])
            unit_names = [*ROW_WRITES, *SHARED_WRITES]
            lane_ready, unit_ready = _write_granted(
                [write_touch[write_names.index(n)] for n in lanes], [urgent[n] for n in lanes],
                [write_touch[write_names.index(n)] for n in unit_names], [unit_asks[n] for n in unit_names],
                [urgent[n] for n in unit_names])
            write_ready = [lane_ready[lanes.index(n)] if n in lanes else unit_ready[unit_names.index(n)]
                           for n in write_names]
            lane_bits = ctx.get(buf.bank_write.ready)
            for kind, names, expected, touches in (("read", SHARED_READS, read_ready, read_touch),
                                                   ("write", write_names, write_ready, write_touch)):
                for name, ready, touch in zip(names, expected, touches):
                    got = bool(lane_bits >> lanes.index(name) & 1 if name in lanes else ctx.get(getattr(buf, name).ready))
                    if got != ready:
                        wrong.append((cycle, name, "ready", got, ready))
                    if touch:
                        grants[kind][ready] += 1
            await ctx.tick()
            for (name, width), ready, touch in zip(SHARED_READS.items(), read_ready, read_touch):
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
        for name in [*SHARED_READS, *ROW_WRITES, "bank_write", *SHARED_WRITES]:
            ctx.set(getattr(buf, name).en, 0)
        for addr in range(0, words, chunk):             # then every word
            ctx.set(buf.check.addr, addr)
            await ctx.tick()
            got = [int(v) for v in ctx.get(buf.check.data)]
            if got != [int(v) for v in model[addr:addr + chunk]]:
                wrong.append(("dump", addr, got))

    sim = Simulator(buf)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert not wrong, wrong[:3]
    for kind, (refused, granted) in grants.items():     # both outcomes happened often
        assert refused > 50 and granted > 200, (kind, refused, granted)


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

    sim = Simulator(buf)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
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
