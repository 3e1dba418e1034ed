"""The core's units at the `u280` preset's own widths (issue 32, "safety net first"): the same cocotb testbenches
as the sim-small unit tests (tests/test_rtl_vector.py, ...), on the single-instruction harness
`Datapath(unit, config="u280", ...)`, bit-exact with the functional simulator instruction by instruction under the
same random issue gaps, AXI pauses and buffer contention, with fewer random instructions (enough to reach every
opcode).

Buffer depths are small: a buffer's depth changes only its address widths (the row address of each of the 17
memories, `BankedBuffer.rows`, and the range checks' bounds), never the port logic, the chunk of 64 words, the 17
memories or a unit's lanes; each test takes the smallest depth its testbench's random placement and fixed cases
need (a multiple of the 64-word chunk; see each DESIGN).

The RTL tests are `slow` (each build alone is minutes); the buffers' tests (Amaranth's simulator) run in the default
suite. Measured on the 2-core machine (2026-11-28) while other jobs ran beside them (load average 4 to 7: the wall
times are about twice the machine's alone; "user" is the CPU time of the whole run), Verilator 5.049, C++ at -O0:

| test | Verilog | Verilator's C++ | build (wall) | peak memory | run (wall) |
|---|---:|---:|---:|---:|---:|
| vector (pass) | 18.3 MB | 123 MB, 171 files | 16 min: conversion 3, Verilator 6 (170 s CPU), C++ 7 | 1.5 GB (Verilator) | 8.8 min |
| router (pass, after the fix below) | 1.8 MB | 19 MB, 26 files | 3.5 min | 0.5 GB | 9.1 min (3.0 of them the regression's 20 cases) |
| DMA (passing so far, see below) | 12.4 MB | 141 MB, 155 files | 17 min: conversion 4, Verilator 2.3, C++ 10 | 1.4 GB (Verilator) | over 40 min |
| matrix (not run) | 18.8 MB | not reached | conversion 4.5 min; Verilator still running after 26 min wall (10 min CPU, 2.1 GB) when stopped | over 2.1 GB | |
| buffers, 4 tests (Amaranth) | | | | 0.1 GB | 23 s + 11 s + 20 s + 56 s |

The whole vector test took 26.5 min wall, 845 s user. At Verilator's default -Os the vector unit's C++ compiled
109 of its 171 files in 10 minutes (the large `_024root` files 1 to 3 minutes each) and was stopped: about an hour
projected, hence `CXX_OPT`.

The DMA test is slow to run, not to build: its 33 cocotbext-axi AxiRams (five channel coroutines each) make the
simulation about 25 cycles a second, and every instruction syncs and dumps ABUF and WBUF (about 650 cycles). In its
first run the on-chip random LOADs, the bad words, the on-chip full rate (busy cycles exactly `DMAUnit.cycles`) and
the 10 random off-chip LOAD / transposed LOAD / STORE / transposed STORE / GATHER (32 HBM ports and the host port,
AXI pauses) passed in 21 minutes. The off-chip errors failed on a testbench assumption, now parameterised: "LOAD past
HBM" started 12 beats before the config's HBM end, which at u280's 32-word beat leaves the 140-word block inside it
(the unit answered BUS from the AxiRams, rightly); it now starts 96 words before the end at either width (not yet
rerun at u280). The off-chip full rate and contention were still running when this was written.

The router test found a real bug at this width, now fixed (hw/core/router.py; regression at sim-small:
tb_router.forward_after_a_refused_write): an ALLGATHER's forwarded slice was read back from ABUF while its last beat
still waited, refused, in the write register, and was sent with the old words.
"""
import pytest

from ringgpt.sim.cocotb_support.runner import Design

HARNESS = "ringgpt.hw.core.datapath:Datapath"
CXX_OPT = "-O0"
"""The Verilator models' C++ optimisation: at Verilator's default (-Os) a u280 unit's 120 MB of C++ takes over an
hour to compile on the 2-core machine."""

# Vector unit, 64 lanes. ABUF 16,384 words: the random cases' blocks (up to 13 rows of up to 6 x 64 + 1 words,
# strides up to n + 5: about 5,000 words each, four of them) fit about as often as sim-small's in its 2,048, and the
# full-rate case puts src2 13 periods of the memories (13 x 64 x 17 words) past src1. WBUF: the config's minimum
# (2 x mac_width x mpu_lanes); the vector unit does not use it.
VECTOR = Design.of(HARNESS, unit="vector", config="u280", abuf_words=16384, wbuf_words=2048).with_cxx_opt(CXX_OPT)
VECTOR_INSTRUCTIONS = {"verilator": 22, "icarus": 11}      # every one of the 11 opcodes twice (once on Icarus)


@pytest.mark.rtl
@pytest.mark.slow
def test_u280_vector_unit_bit_exact(run_tb, sim):
    run_tb(VECTOR, "ringgpt.sim.tb.tb_vector", seed=4, instructions=VECTOR_INSTRUCTIONS[sim],
           issue_valid_probability=0.5)


# --- buffers: 17 memories of 64-word chunks (Amaranth's simulator, as tests/test_rtl_buffers.py at sim-small) ----------

def _u280_geometry():
    from ringgpt.hw.config import get_config
    cfg = get_config("u280")
    return cfg, cfg.buffer_chunk_words, cfg.buffer_banks


def _bits(rng, width: int) -> int:
    """`width` random bits (masks wider than NumPy's 64-bit integers)."""
    return int.from_bytes(rng.bytes(-(-width // 8)), "little") & ((1 << width) - 1)


def _simulate(buf, testbench):
    import sys

    from amaranth.sim import Simulator
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


def test_u280_banked_buffer_matches_a_word_array():
    """tests/test_rtl_buffers.py's word-array test at u280's geometry: random reads and writes of 64, 37 and 1
    words on three ports each at any address (chunk straddles, memory 16's chunk wrapping to memory 0's next row, the
    buffer's end, addresses near 2**32), random masks; 40 chunks, so the last row of the 17 memories is partial."""
    import numpy as np
    from test_rtl_buffers import _address

    from ringgpt.hw.core.buffers import BankedBuffer
    _, chunk, banks = _u280_geometry()
    reads, writes = {"r_wide": chunk, "r_odd": 37, "r_one": 1}, {"w_wide": chunk, "w_odd": 41, "w_one": 1}
    words, cycles = 40 * chunk, 160
    buf = BankedBuffer(words, chunk=chunk, banks=banks, reads=reads, writes=writes)
    rng = np.random.default_rng(17)
    model = np.zeros(words, dtype=np.int64)
    wrong = []

    async def testbench(ctx):
        for cycle in range(cycles):
            addrs = {name: _address(rng, words, width, chunk) for name, width in reads.items()}
            for name, addr in addrs.items():
                ctx.set(getattr(buf, name).addr, addr)
            landed = {}
            for name, width in writes.items():
                port = getattr(buf, name)
                en = cycle <= 45 or rng.random() < 0.7     # fill first, then mix
                addr = _address(rng, words, width, chunk) if cycle > 45 else cycle * chunk % words
                mask = _bits(rng, width) if rng.random() < 0.5 and cycle > 45 else (1 << width) - 1
                values = [int(v) for v in rng.integers(0, 1 << 16, width)]
                for member, value in (("en", en), ("addr", addr), ("mask", mask), ("data", values)):
                    ctx.set(getattr(port, member), value)
                if en:
                    landed[name] = (addr, mask, values)
            await ctx.tick()
            for name, addr in addrs.items():            # the words before this cycle's writes
                if addr + reads[name] <= words:
                    got = [int(v) for v in ctx.get(getattr(buf, name).data)]
                    if got != [int(v) for v in model[addr:addr + reads[name]]]:
                        wrong.append((cycle, name, addr))
            for name in writes:                         # later ports win: apply in order
                if name in landed:
                    addr, mask, values = landed[name]
                    for i, value in enumerate(values):
                        if mask >> i & 1 and addr + i < words:
                            model[addr + i] = value
        for name in writes:
            ctx.set(getattr(buf, name).en, 0)
        for addr in range(0, words, chunk):             # then every word
            ctx.set(buf.r_wide.addr, addr)
            await ctx.tick()
            if [int(v) for v in ctx.get(buf.r_wide.data)] != [int(v) for v in model[addr:addr + chunk]]:
                wrong.append(("dump", addr))

    _simulate(buf, testbench)
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("port", ["matrix_wbuf", "vector_abuf"])
def test_u280_tile_port_reads_every_lane_in_the_counted_cycles(port):
    """The tile ports the u280 units use, over 17 memories of 64-word chunks: the matrix unit's WBUF port (16
    aligned weight lanes of 64 words and the bias lane of 16 words at any address) and the vector unit's ABUF port
    (3 lanes of 64 at any address, `single` lanes as a row scalar's). Lane addresses a stride apart (0, one chunk,
    a whole period of 17 chunks: one memory, and at random), random enables; each request's cycles equal
    `tile_read_cycles` and every enabled lane's wanted words arrive the cycle after `ready`."""
    import numpy as np
    from test_rtl_buffers import _fill

    from ringgpt.hw.core.buffers import BankedBuffer
    from ringgpt.hw.core.interfaces import TileReadPort
    cfg, chunk, banks = _u280_geometry()
    if port == "matrix_wbuf":
        lanes = cfg.mpu_lanes + 1
        tile = TileReadPort(lanes, chunk, (chunk,) * cfg.mpu_lanes + (cfg.mpu_lanes,),
                            aligned=(True,) * cfg.mpu_lanes + (False,))
    else:
        lanes = 3
        tile = TileReadPort(lanes, chunk)
    widths, aligned = np.array(tile.widths), np.array(tile.aligned)
    words = 4 * banks * chunk
    buf = BankedBuffer(words, chunk=chunk, banks=banks, reads={}, writes={"fill": chunk}, tiles={"tile": tile})
    rng = np.random.default_rng(29)
    model = rng.integers(0, 1 << 16, words)
    wrong, counted = [], []
    from ringgpt.hw.banks import tile_read_cycles

    def request():
        kind = rng.integers(5)
        if kind == 4:
            starts = rng.integers(0, words - chunk, lanes)
        else:
            stride = [0, chunk, banks * chunk, int(rng.integers(1, 3 * chunk))][kind]
            if (lanes - 1) * stride > words - 2 * chunk:
                stride = chunk
            starts = int(rng.integers(0, words - chunk - (lanes - 1) * stride)) + stride * np.arange(lanes)
        starts = np.where(aligned, starts // chunk * chunk, starts)
        return starts, rng.random(lanes) < 0.85, (rng.random(lanes) < 0.25) & ~aligned

    async def testbench(ctx):
        await _fill(ctx, buf.fill, model, chunk)
        for _ in range(120):
            starts, enabled, single = request()
            ctx.set(buf.tile.addr, [int(a) for a in starts])
            ctx.set(buf.tile.en, int(sum(int(e) << lane for lane, e in enumerate(enabled))))
            ctx.set(buf.tile.single, int(sum(int(e) << lane for lane, e in enumerate(single))))
            cycles = 1
            while not ctx.get(buf.tile.ready):
                await ctx.tick()
                cycles += 1
            await ctx.tick()
            ctx.set(buf.tile.en, 0)
            expected = int(tile_read_cycles(starts, enabled, np.where(single, 1, widths), chunk, banks))
            counted.append(cycles)
            if cycles != expected:
                wrong.append(("cycles", list(starts), list(enabled), cycles, expected))
            data = ctx.get(buf.tile.data)
            for lane in range(lanes):
                if enabled[lane]:
                    wanted = 1 if single[lane] else widths[lane]
                    if [int(v) for v in data[lane]][:wanted] != [int(v) for v in model[starts[lane]:starts[lane] + wanted]]:
                        wrong.append(("data", list(starts), lane))

    _simulate(buf, testbench)
    assert not wrong, wrong[:3]
    assert max(counted) >= 3 and min(counted) == 1      # the cases reached both ends


def test_u280_shared_ports_grant_in_priority_order():
    """tests/test_rtl_buffers.py's grant test at u280's geometry (17 memories of 64-word chunks): three
    SharedReadPorts (64, 37 and a 32-word beat), three RowWritePorts (of two, one and two chunks), a BankWritePort of
    17 rows (the DMA engines' crossbar) and two SharedWritePorts (64 and 37 words) over one read and one write port
    per memory; random requests clustered on a few chunks, some urgent: `ready` exactly the grant of the Python
    model (`_granted`, `_write_granted`), every granted read's words the cycle after, every granted write landed
    and nothing else; every word read back at the end."""
    import numpy as np
    from test_rtl_buffers import _address, _granted, _write_granted

    from ringgpt.hw.core.buffers import BankedBuffer
    _, chunk, banks = _u280_geometry()
    shared_reads, row_writes = {"s_wide": chunk, "s_odd": 37, "s_beat": 32}, {"w_first": 2, "w_second": 1, "w_third": 2}
    shared_writes = {"sw_wide": chunk, "sw_odd": 37}
    words, cycles = 3 * banks * chunk, 150
    chunks = words // chunk
    held = -(-chunks // banks)
    lanes = [f"bank_write{b}" for b in range(banks)]
    buf = BankedBuffer(words, chunk=chunk, banks=banks, reads={"check": chunk}, writes={}, shared_reads=shared_reads,
                       row_writes=row_writes, bank_writes=["bank_write"], shared_writes=shared_writes)
    write_names = [*row_writes, *lanes, *shared_writes]
    unit_names = [*row_writes, *shared_writes]
    rng = np.random.default_rng(41)
    model = np.zeros(words, dtype=np.int64)
    wrong, grants = [], {"read": [0, 0], "write": [0, 0]}

    def near(hot, width):
        return (hot * chunk + int(rng.integers(-chunk, 2 * chunk))) % words if rng.random() < 0.6 else \
            _address(rng, words, width, chunk)

    async def testbench(ctx):
        for cycle in range(cycles):
            hot = int(rng.integers(0, chunks))
            read_touch, reads = [], {}
            for name, width in shared_reads.items():
                port, en = getattr(buf, name), bool(rng.random() < 0.8)
                reads[name] = addr = near(hot, width)
                ctx.set(port.en, en)
                ctx.set(port.addr, addr)
                read_touch.append({c % banks for c in {addr // chunk, (addr + width - 1) // chunk}} if en else set())
            write_touch, writes, unit_asks = [], {}, {}
            for name, rows in row_writes.items():
                port, en = getattr(buf, name), bool(rng.random() < 0.8 and cycle > 3)
                first = (hot + int(rng.integers(-1, 2))) % chunks if rng.random() < 0.6 else \
                    int(rng.choice([rng.integers(0, chunks), chunks - 1, chunks]))
                mask = _bits(rng, rows * chunk) if rng.random() < 0.7 else \
                    [(1 << chunk) - 1, ((1 << chunk) - 1) << chunk, 0][int(rng.integers(3))] & ((1 << rows * chunk) - 1)
                values = [int(v) for v in rng.integers(0, 1 << 16, rows * chunk)]
                for member, value in (("en", en), ("first", first), ("mask", mask), ("data", values)):
                    ctx.set(getattr(port, member), value)
                unit_asks[name] = en
                writes[name] = (first, mask, values)
                write_touch.append({(first + h) % banks for h in range(rows) if mask >> (h * chunk) & ((1 << chunk) - 1)}
                                   if en else set())
            lane_en, lane_rows, lane_masks, lane_values = 0, [], [], []
            for b, name in enumerate(lanes):            # a row of memory b: chunk row * banks + b
                en = bool(rng.random() < 0.6 and cycle > 3)
                row = (hot // banks + int(rng.integers(-1, 2))) % held if rng.random() < 0.6 else \
                    int(rng.choice([rng.integers(0, held), held - 1, held]))
                mask, values = _bits(rng, chunk), [int(v) for v in rng.integers(0, 1 << 16, chunk)]
                lane_en |= en << b
                lane_rows.append(row)
                lane_masks.append(mask)
                lane_values.append(values)
                writes[name] = (row * banks + b, mask, values)
                write_touch.append({b} if en else set())
            for member, value in (("en", lane_en), ("row", lane_rows), ("mask", lane_masks), ("data", lane_values)):
                ctx.set(getattr(buf.bank_write, member), value)
            for name, width in shared_writes.items():   # the words at any address; they claim their window
                port, en = getattr(buf, name), bool(rng.random() < 0.6 and cycle > 3)
                addr, mask = near(hot, width), _bits(rng, width)
                values = [int(v) for v in rng.integers(0, 1 << 16, width)]
                for member, value in (("en", en), ("addr", addr), ("mask", mask), ("data", values)):
                    ctx.set(getattr(port, member), value)
                unit_asks[name] = en
                writes[name] = (addr // chunk, mask << addr % chunk, [0] * (addr % chunk) + values)
                write_touch.append({c % banks for c in {addr // chunk, (addr + width - 1) // chunk}} if en else set())
            urgent = {name: bool(rng.random() < 0.3) for name in [*shared_reads, *write_names]}
            for name, value in urgent.items():
                if name not in lanes:
                    ctx.set(getattr(buf, name).urgent, value)
            ctx.set(buf.bank_write.urgent, sum(urgent[name] << b for b, name in enumerate(lanes)))
            read_ready = _granted(read_touch, [urgent[name] for name in shared_reads])
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
                    if [int(v) for v in ctx.get(getattr(buf, name).data)] != [int(v) for v in model[addr:addr + width]]:
                        wrong.append((cycle, name, addr, "data"))
            for name, ready, touch in zip(write_names, write_ready, write_touch):
                first, mask, values = writes[name]
                if touch and ready:
                    for i, value in enumerate(values):
                        if mask >> i & 1 and first * chunk + i < words:
                            model[first * chunk + i] = value
        for name in [*shared_reads, *row_writes, "bank_write", *shared_writes]:
            ctx.set(getattr(buf, name).en, 0)
        for addr in range(0, words, chunk):             # then every word
            ctx.set(buf.check.addr, addr)
            await ctx.tick()
            if [int(v) for v in ctx.get(buf.check.data)] != [int(v) for v in model[addr:addr + chunk]]:
                wrong.append(("dump", addr))

    _simulate(buf, testbench)
    assert not wrong, wrong[:3]
    for kind, (refused, granted) in grants.items():     # both outcomes happened often
        assert refused > 40 and granted > 150, (kind, refused, granted)


# --- router, DMA, matrix unit -------------------------------------------------------------------------------------

# Router, 64-word payload. ABUF 34,816 words (32 periods of the memories): the testbench's SEND/RECV blocks reach
# 2 x 64 rows of 4 x 64 + 4 words (point_program's largest, which it places without retrying: 33,276 words).
ROUTER = Design.of(HARNESS, unit="router", config="u280", abuf_words=34816, wbuf_words=2048).with_cxx_opt(CXX_OPT)
ROUTER_CASES = {"verilator": 9, "icarus": 3}                # ALLGATHER, SEND, RECV three times each


@pytest.mark.rtl
@pytest.mark.slow
def test_u280_router_bit_exact(run_tb, sim):
    run_tb(ROUTER, "ringgpt.sim.tb.tb_router", seed=3, cases=ROUTER_CASES[sim], issue_valid_probability=0.5,
           link_pause=0.3)


# DMA unit: 32 HBM port engines of 512-bit beats and the host port. ABUF 16,384 words: the on-chip full-rate case's
# transposed 64 x 128 block lands past its source (2 x 64 x 64 words on); WBUF 4,416: its transposed 67 x 65 block
# (4,355 words). The test HBM: 65,536 words, 2,048 (4 KiB) a channel as at sim-small, room for the full-rate
# sequential LOAD and STORE of all of ABUF.
DMA = Design.of(HARNESS, unit="dma", config="u280", abuf_words=16384, wbuf_words=4416).with_cxx_opt(CXX_OPT)
DMA_INSTRUCTIONS = {"verilator": 4, "icarus": 2}           # on-chip LOADs, straight and transposed in turn
DMA_OFFCHIP = {"verilator": 10, "icarus": 5}               # LOAD, transposed LOAD, STORE, transposed STORE, GATHER


@pytest.mark.rtl
@pytest.mark.slow
def test_u280_dma_bit_exact(run_tb, sim):
    run_tb(DMA, "ringgpt.sim.tb.tb_dma", seed=5, instructions=DMA_INSTRUCTIONS[sim], offchip=DMA_OFFCHIP[sim],
           issue_valid_probability=0.5, axi_pause=0.3, hbm_words=65536)


# Matrix unit, 16 lanes x 64 MACs. ABUF 4,096 words: the random x and result blocks (up to 9 rows of up to 325 and
# 84 words); WBUF 16,384: the full-rate cases' weights and the bias 14 periods on (15,344 words; the largest random
# weight blocks, 79 columns up to 384 words apart, are redrawn, as at sim-small).
MATRIX = Design.of(HARNESS, unit="matrix", config="u280", abuf_words=4096, wbuf_words=16384).with_cxx_opt(CXX_OPT)
MATRIX_INSTRUCTIONS = {"verilator": 12, "icarus": 3}       # MATMUL (bias, GELU) and MASKED_QK


@pytest.mark.rtl
@pytest.mark.slow
def test_u280_matrix_unit_bit_exact(run_tb, sim):
    run_tb(MATRIX, "ringgpt.sim.tb.tb_matrix", seed=3, instructions=MATRIX_INSTRUCTIONS[sim],
           issue_valid_probability=0.5)
