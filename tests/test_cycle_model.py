"""The cycle model: hand-computed costs for every instruction class on the sim-small preset, and the
overlap the scoreboard allows (independent units overlap, dependences wait, barriers, queue-depth
stalls, collectives across cards)."""
import dataclasses

import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.assembly import assemble
from ringgpt.hw.isa import OPCODES, Flags, Opcode, Space, Unit, opcodes_of
from ringgpt.hw.program import Program
from ringgpt.host.image import ApplianceImage, CardImage
from ringgpt.hw.resolved import Resolved, access_ranges, scoreboard_ranges
from ringgpt.hw.core.timing import router_cycles
from ringgpt.sim.cycle_model import instruction_class, instruction_cost, link_excess, occupancy, schedule, unit_timing
from ringgpt.sim.cycle_model import scheduler, stalls
from ringgpt.sim.cycle_model.fetch import _fetch_shape
from ringgpt.sim.cycle_model.occupancy import COMPUTE_PARTS, TERMS
from ringgpt.sim.cycle_model.scheduler import _costed
from ringgpt.sim.functional import SimulatorDevice

CFG = get_config("sim-small")


def test_the_preset_figures_these_costs_assume():
    # mac 8 x 4 lanes, 8 vector lanes, HBM latency 32, host 120 B/cycle, ring 121 B/cycle + a 34-cycle hop
    # (260 + 5 ns + 8 cycles of clock crossing at 100 MHz: 34.5, rounded to even)
    assert (CFG.mac_width, CFG.mpu_lanes, CFG.vector_width) == (8, 4, 8)
    assert CFG.hbm_latency_cycles == 32 and CFG.ring_bytes_per_cycle == pytest.approx(121.0)
    assert CFG.ring_latency_ns == pytest.approx(345.0) and CFG.ring_latency_cycles == 34
    assert CFG.queue_depth == 8
    # pipeline depths and overheads come from the RTL units (hw/core), not from the config
    assert unit_timing(CFG) == {"matrix": {"latency": 33, "int8_latency": 34, "row_max": 2, "overhead": 4, "loop": 5},
                                "vector": {"latency": {"elementwise": 10, "sum": 18, "max": 4}, "overhead": 4,
                                           "loop": 5, "step": {op: 2 if OPCODES[op].special else 8
                                                               for op in opcodes_of(Unit.VECTOR)}}}
    # fetch: a 512-bit word is 4 beats of the 128-bit port; a 32-word FIFO, bursts of 8 words
    assert _fetch_shape(CFG) == (4, 32, 8) and _fetch_shape(get_config("u280")) == (1, 64, 16)


ABUF, WBUF, HBM, HOST = ((s, 0) for s in (Space.ABUF, Space.WBUF, Space.HBM, Space.HOST))


@pytest.mark.parametrize("resolved,cost,cls", [
    (Resolved(Opcode.MATMUL, rows=3, n=40, k=100, dst=ABUF, src1=ABUF, src2=WBUF),
     (Unit.MATRIX, 4 + 3 * 13 * 10 + 33, 0, 0, 0), "matrix"),
    # dst and aux both at 0: row 0's maximum (memory 0) is written with pair 4's results (row 1, group 1: words
    # 4..7 at dst_stride 0, memory 0), so one waits a cycle
    (Resolved(Opcode.MASKED_QK, rows=2, n=9, k=64), (Unit.MATRIX, 4 + 2 * 8 * 3 + 1 + 33 + 2, 0, 0, 0), "matrix"),
    (Resolved(Opcode.VADD, rows=2, n=20), (Unit.VECTOR, 4 + 2 * 3 + 10, 0, 0, 0), "vector"),
    # a special function: 2 elements a step (special_lanes), 10 steps a row of 20
    (Resolved(Opcode.VEXP, rows=2, n=20), (Unit.VECTOR, 4 + 2 * 10 + 10, 0, 0, 0), "vector"),
    (Resolved(Opcode.VSUM, rows=5, n=8), (Unit.VECTOR, 4 + 5 + 18, 0, 0, 0), "vector"),
    # a single row's sum waits for the accumulator's adder loop (5 cycles) between chunks
    (Resolved(Opcode.VSUM, rows=1, n=24), (Unit.VECTOR, 4 + 2 * 5 + 1 + 18, 0, 0, 0), "vector"),
    (Resolved(Opcode.MATMUL, rows=1, n=4, k=24), (Unit.MATRIX, 4 + 2 * 5 + 1 + 33, 0, 0, 0), "matrix"),
    # weight rows 5 chunks apart (a multiple of the 5 buffer memories): a beat's 4 lanes read 4 chunks of one
    # memory, 3 stalls a beat, 2 beats; rows 12 words apart: chunks 0, 1-2, 3, 4-5, memory 0 twice, 1 stall a beat
    (Resolved(Opcode.MATMUL, rows=1, n=8, k=8, src2=(Space.WBUF, 80), src2_stride=40),
     (Unit.MATRIX, 4 + 2 + 2 * 3 + 33, 0, 0, 0), "matrix"),
    (Resolved(Opcode.MATMUL, rows=2, n=4, k=8, src2=(Space.WBUF, 0), src2_stride=12),
     (Unit.MATRIX, 4 + 2 + 2 * 1 + 33, 0, 0, 0), "matrix"),
    # one tile: the bias, read with it and the weights (4 columns 8 words apart: memories 0..3 of WBUF): in the
    # free memory 4 (aux 32) no stall; at aux 40 (memory 0, another row than column 0's chunk) 1 stall. (x, alone in
    # ABUF's tile port since the keys and V^T are in WBUF, never stalls.)
    (Resolved(Opcode.MATMUL, rows=1, n=4, k=8, src1=(Space.ABUF, 0), src2=(Space.WBUF, 0), src2_stride=8,
              aux=(Space.WBUF, 32)), (Unit.MATRIX, 4 + 1 + 33, 0, 0, 0), "matrix"),
    (Resolved(Opcode.MATMUL, rows=1, n=4, k=8, src1=(Space.ABUF, 0), src2=(Space.WBUF, 0), src2_stride=8,
              aux=(Space.WBUF, 40)), (Unit.MATRIX, 4 + 1 + 1 + 33, 0, 0, 0), "matrix"),
    # two tiles, columns 16 words apart: lanes 0..3 in memories 0, 2, 4, 1 (tile 0) and 1, 3, 0, 2 (tile 1), the
    # free memory 3, then 4 (where a lane 4 would fall). A bias at 64 (memory 3) is read with tile 0: no stall (at
    # the last tile it would meet lane 1's chunk); at 80 (memory 0, never free) with the last tile: 1 stall
    (Resolved(Opcode.MATMUL, rows=1, n=4, k=16, src1=(Space.ABUF, 0), src2=(Space.WBUF, 0), src2_stride=16,
              aux=(Space.WBUF, 64)), (Unit.MATRIX, 4 + 5 + 1 + 33, 0, 0, 0), "matrix"),
    (Resolved(Opcode.MATMUL, rows=1, n=4, k=16, src1=(Space.ABUF, 0), src2=(Space.WBUF, 0), src2_stride=16,
              aux=(Space.WBUF, 80)), (Unit.MATRIX, 4 + 5 + 1 + 1 + 33, 0, 0, 0), "matrix"),
    # vector operands in one memory (5 memories of 8-word chunks, a period of 40 words): src2 40 words after src1
    # puts each chunk's two reads in one memory, 1 stall a chunk; 8 words after, never; unaligned, chunks t, t + 1
    # and 5 + t, 6 + t: 1 stall (2 distinct chunks in each of 2 memories); a row scalar at 40 meets chunk 0 only,
    # at 3 it is in src1's own chunk 0 (one read serves both)
    (Resolved(Opcode.VADD, rows=1, n=16, src1=(Space.ABUF, 0), src2=(Space.ABUF, 40)),
     (Unit.VECTOR, 4 + 2 + 2 + 10, 0, 0, 0), "vector"),
    (Resolved(Opcode.VADD, rows=1, n=16, src1=(Space.ABUF, 0), src2=(Space.ABUF, 8)),
     (Unit.VECTOR, 4 + 2 + 10, 0, 0, 0), "vector"),
    (Resolved(Opcode.VADD, rows=1, n=16, src1=(Space.ABUF, 4), src2=(Space.ABUF, 44)),
     (Unit.VECTOR, 4 + 2 + 2 + 10, 0, 0, 0), "vector"),
    (Resolved(Opcode.VSUB, rows=1, n=16, src1=(Space.ABUF, 0), src2=(Space.ABUF, 40), flags=Flags(src2_row_scalar=1)),
     (Unit.VECTOR, 4 + 2 + 1 + 10, 0, 0, 0), "vector"),
    (Resolved(Opcode.VSUB, rows=1, n=16, src1=(Space.ABUF, 0), src2=(Space.ABUF, 3), flags=Flags(src2_row_scalar=1)),
     (Unit.VECTOR, 4 + 2 + 10, 0, 0, 0), "vector"),
    # DMA off chip (tests/test_hbm_model.py has one test per effect): the RTL unit's count, accept, check,
    # drain-detect, done (4) + the first job (1) + first beat to last + the request (3), latency (32) and write
    # register (1), the latency now unit time. 4 rows of 100 words all at word 0: 4 bursts of 224 B on channel 0,
    # 896 / 14.4 B/cycle + 3 page misses = 65.2 -> 66 cycles of the channel.
    (Resolved(Opcode.LOAD, rows=4, n=100, dst=WBUF, src1=HBM), (Unit.DMA, 5 + 65 + 36, 800, 0, 0), "dma-hbm"),
    # 64 words: 8 beats, 128 B / 14.4 = 8.9 -> 9 on the channel; a STORE ends with its response (3 + 2 + 32)
    (Resolved(Opcode.STORE, rows=1, n=64, dst=HBM, src1=ABUF), (Unit.DMA, 5 + 8 + 37, 128, 0, 0), "dma-hbm"),
    # 512 words, a granule on each of the 4 channels: their 64 beats one per cycle through the engines' one ABUF read
    # (16 per channel in parallel, 18 cycles of each channel, would take 17)
    (Resolved(Opcode.STORE, rows=1, n=512, dst=HBM, src1=ABUF), (Unit.DMA, 5 + 63 + 37, 1024, 0, 0), "dma-hbm"),
    # the index read (3 + 32 + 1, then 1), then 2 jobs; 256 B on channel 0: 17.8 -> 18
    (Resolved(Opcode.GATHER, rows=2, n=64, src1_stride=64, dst=ABUF, src1=HBM, src2=HOST),
     (Unit.DMA, 5 + 37 + 17 + 36, 256, 0, 0), "dma-hbm"),
    (Resolved(Opcode.STORE, rows=1, n=600, dst=HOST, src1=ABUF), (Unit.DMA, 5 + 74 + 37, 0, 0, 1200), "dma-host"),
    # on chip, the RTL's count (hw/core/dma.py): overhead 4 + one step per 8-word chunk + latency 2; transposed
    # through the 8 x 8 tile: 13 chunks x (4 fill + 1 wait) + 100 drain steps, + overhead 4 + drain latency 1
    (Resolved(Opcode.LOAD, rows=4, n=100, dst=WBUF, src1=ABUF), (Unit.DMA, 4 + 4 * 13 + 2, 0, 0, 0), "dma-onchip"),
    (Resolved(Opcode.LOAD, rows=4, n=100, dst=ABUF, src1=ABUF, flags=Flags(transpose=1)),
     (Unit.DMA, 4 + 13 * 5 + 100 + 1, 0, 0, 0), "dma-onchip"),
    # the router's own cycles (hw/core/router.py): SEND posts, sends the header and 26 beats, the last 2 cycles
    # after its read; RECV takes the header and 26 beats. The hop is the receiver's wait (schedule).
    (Resolved(Opcode.SEND, rows=2, n=100), (Unit.ROUTER, 4 + 2 + 26 + 2, 0, 400, 0), "router"),
    (Resolved(Opcode.RECV, rows=2, n=100), (Unit.ROUTER, 4 + 1 + 26, 0, 0, 0), "router"),
    (Resolved(Opcode.SETI), (Unit.CONTROL, 1, 0, 0, 0), "control"),
    (Resolved(Opcode.HALT), (Unit.CONTROL, 1, 0, 0, 0), "control"),
])
def test_hand_computed_costs(resolved, cost, cls):
    assert tuple(instruction_cost(resolved, CFG)) == cost
    assert instruction_class(resolved) == cls


def test_allgather_is_the_routers_cycles_plus_a_hop_a_step():
    slices = ((5, 0), (3, 5), (4, 8), (2, 12))
    r = Resolved(Opcode.ALLGATHER, card=0, rows=2, n=5, k=0, dst=(Space.ABUF, 100), src1=(Space.ABUF, 100),
                 slices=slices)
    # On direct links (hw/core/router.py, store and forward of 2-beat slices, in place): 28 cycles; 3 steps of
    # the 34-cycle hop. Card 0 forwards all slices but card 1's.
    assert tuple(instruction_cost(r, CFG.with_cards(4))) == (Unit.ROUTER, 28 + 3 * 34, 0, 2 * 2 * (14 - 3), 0)
    # two cards, one beat each way: post 3, header on the link 5, its first beat at the other card 9, the last
    # written 9, done 11; on the simulated ring (no hop) that is all
    two = Resolved(Opcode.ALLGATHER, card=0, rows=1, n=8, dst=(Space.ABUF, 0), src1=(Space.ABUF, 0),
                   slices=((8, 0), (8, 8)))
    assert instruction_cost(two, CFG.with_cards(2)).cycles == 11 + 34
    direct = dataclasses.replace(CFG, ring_phy_ns=0.0, ring_cable_ns=0.0, ring_cdc_cycles=0).with_cards(2)
    assert instruction_cost(two, direct).cycles == 11


def test_a_link_slower_than_the_router_adds_cycles_per_step():
    u280 = get_config("u280")
    # a 400-word slice is 7 beats of 64 words (128 B) and a header: 1,024 B; the link carries 12.1 GB/s, 48.4 B
    # a cycle at 250 MHz (21.2 -> 22 cycles, 14 more than the router's 8) and 60.5 at 200 MHz (17 cycles, 9 more)
    assert link_excess(7, u280) == 14 and link_excess(7, u280.at_clock(200)) == 9
    assert link_excess(7, CFG) == 0  # 121 B a cycle is faster than sim-small's 16-byte beat
    r = Resolved(Opcode.ALLGATHER, card=1, rows=1, n=400, k=400, dst=(Space.ABUF, 0), src1=(Space.ABUF, 400),
                 slices=((400, 0), (400, 400), (400, 800), (400, 1200)))
    x4 = u280.with_cards(4)
    assert instruction_cost(r, x4).cycles == router_cycles(x4, Opcode.ALLGATHER, 1, 400, slices=r.slices, card=1) \
        + 3 * (109 + 14)  # the hop at 250 MHz: 405 ns + 8 cycles of clock crossing


def test_access_ranges_are_bounding_intervals():
    r = Resolved(Opcode.MATMUL, rows=3, n=4, k=10, dst=(Space.ABUF, 100), src1=(Space.ABUF, 0),
                 src2=(Space.WBUF, 50), aux=(Space.ABUF, 900), dst_stride=8, src1_stride=16, src2_stride=12)
    assert access_ranges(r) == (((Space.ABUF, 0, 42), (Space.WBUF, 50, 96), (Space.ABUF, 900, 904)),
                                ((Space.ABUF, 100, 120),))
    t = Resolved(Opcode.STORE, rows=1, n=64, dst=(Space.HBM, 7), src1=(Space.ABUF, 0), dst_stride=1024,
                 flags=Flags(transpose=1))
    assert access_ranges(t) == (((Space.ABUF, 0, 64),), ((Space.HBM, 7, 7 + 63 * 1024 + 1),))
    v = Resolved(Opcode.VSCALE_SHIFT, rows=2, n=5, dst=(Space.ABUF, 0), src1=(Space.ABUF, 0), src2=(Space.IMM, 0x3C00),
                 aux=(Space.ABUF, 40), aux_stride=3, src1_stride=5, dst_stride=5, flags=Flags(aux_row_scalar=1))
    assert access_ranges(v) == (((Space.ABUF, 0, 10), (Space.ABUF, 40, 44)), ((Space.ABUF, 0, 10),))


def run(texts, cfg=CFG):
    """The cycle report of one run of the given per-card assembly."""
    return run_with_traces(texts, cfg)[0]


LOAD_LONG = "LOAD dst=WBUF[4096] src1=HBM[0] rows=1 n=2880"
# 5,760 B = 22.5 granules of 256 B over 4 channels (XOR interleave): channel 0 gets 6 granules, 1,536 B, 96 beats:
# 1536 / 14.4 B/cycle = 106.7 -> 107 cycles of the channel; with the fixed 5 + 36: 147 cycles on the DMA unit.
MATMUL_BANK0 = "MATMUL dst=ABUF[0] src1=ABUF[100] src2=WBUF[0] rows=1 n=16 k=64 src2_stride=64"  # 4 + (7 * 5 + 4) + 33 = 76
# Fetch at sim-small: the first word's 4 beats arrive 2 + 1 + 32 cycles after the start (request, handshake,
# latency), its last one at 38; 2 cycles through fetch's FIFO and 1 into the controller's head: decided at 41.
# Then one word every 4 beats: word i at 41 + 4 i. A unit takes an instruction 2 cycles after its decision (its
# queue); a dependant is decided in the cycle its producer is done.


def test_fetch_issues_one_word_per_four_beats_at_sim_small_and_one_per_cycle_at_u280():
    nops = "\n".join(["NOP"] * 16 + ["HALT"])
    assert [t[1] for t in run(nops).cards[0].timeline] == [41 + 4 * i for i in range(17)]
    assert run(nops).cycles == 41 + 4 * 16 + 1
    # u280: 512-bit beats, 64 cycles of latency: word i at 2 + 1 + 64 + 3 + i
    assert run(nops, get_config("u280")).cycles == 70 + 16 + 1


def test_fetch_fifo_runs_dry_after_a_stall():
    """A BARRIER holds the head while fetch fills its 32-word FIFO; the words in it then go at one a cycle, and the
    next burst is asked for only when 8 words have left (the 8th at 190): 191 + 1 + 32 = 224 is its first beat."""
    text = "\n".join(["VADD dst=ABUF[1000] src1=ABUF[0] src2=IMM[0x3c00] rows=4 n=256", "BARRIER"] + ["NOP"] * 40
                     + ["HALT"])  # the VADD: 4 + 128 + 10 = 142 cycles, from 43 to 185
    timeline = run(text).cards[0].timeline
    assert [t[1] for t in timeline[:4]] == [41, 185, 186, 187]
    assert timeline[31][1] == 215 and timeline[32][1] == 230   # word 32: last beat 227, FIFO 2, head 1
    assert timeline[-1][1] == 230 + 4 * 10


def test_independent_dma_overlaps_matmul():
    report = run(f"{LOAD_LONG}\n{MATMUL_BANK0}\nHALT")
    assert report.cards[0].timeline == [("LOAD", 41, 43, 190), ("MATMUL", 45, 47, 123), ("HALT", 190, 190, 191)]
    assert report.cycles == 191
    assert report.cards[0].busy == {"DMA": 147, "MATRIX": 76, "CONTROL": 1}


def test_a_hazard_holds_every_later_instruction():
    """The scoreboard stops the head: the MATMUL waits for its weights in the controller, and the instruction
    behind it (a NOP, a VADD) waits with it."""
    report = run(f"{LOAD_LONG}\n{MATMUL_BANK0.replace('WBUF[0]', 'WBUF[4096]')}\nNOP\n"
                 "VADD dst=ABUF[200] src1=ABUF[504] src2=IMM[0x3c00] rows=1 n=64\nHALT")
    assert report.cards[0].timeline[1:4] == [("MATMUL", 190, 192, 268), ("NOP", 191, 191, 192),
                                             ("VADD", 192, 194, 216)]
    assert report.cycles == 269


def test_write_after_read_and_read_after_write_wait():
    war = run(f"{MATMUL_BANK0}\n{LOAD_LONG.replace('WBUF[4096]', 'WBUF[960]')}\nHALT")
    assert war.cards[0].timeline[:2] == [("MATMUL", 41, 43, 119), ("LOAD", 119, 121, 268)]
    raw = run("VADD dst=ABUF[100] src1=ABUF[504] src2=IMM[0x3c00] rows=1 n=64\n" + MATMUL_BANK0 + "\nHALT")
    assert raw.cards[0].timeline[:2] == [("VADD", 41, 43, 65), ("MATMUL", 65, 67, 143)]
    independent = run("VADD dst=ABUF[200] src1=ABUF[504] src2=IMM[0x3c00] rows=1 n=64\n" + MATMUL_BANK0 + "\nHALT")
    assert independent.cards[0].timeline[1] == ("MATMUL", 45, 47, 123)


def test_barrier_waits_for_everything_issued_before_it():
    report = run(f"{LOAD_LONG}\nBARRIER\n{MATMUL_BANK0}\nHALT")
    assert report.cards[0].timeline == [("LOAD", 41, 43, 190), ("BARRIER", 190, 190, 191), ("MATMUL", 191, 193, 269),
                                        ("HALT", 269, 269, 270)]


def test_full_unit_queue_stalls_the_decoder():
    # 32 B on channel 0: 2 beats, the request window (16 x 33 cycles) 3 cycles a port: 5 + 2 + 36 = 43 cycles
    loads = "\n".join(f"LOAD dst=ABUF[{1000 + 16 * i}] src1=HBM[{16 * i}] rows=1 n=16" for i in range(4))
    text = f"{loads}\nVADD dst=ABUF[0] src1=ABUF[504] src2=IMM[0x3c00] rows=1 n=16\nHALT"          # 16 cycles
    shallow = run(text, dataclasses.replace(CFG, queue_depth=2))
    # the 4th LOAD enters the queue once the 2nd has left it (at 86)
    assert shallow.cards[0].timeline[:5] == [("LOAD", 41, 43, 86), ("LOAD", 45, 86, 129), ("LOAD", 49, 129, 172),
                                             ("LOAD", 87, 172, 215), ("VADD", 88, 90, 106)]
    deep = run(text)
    assert deep.cards[0].timeline[3:5] == [("LOAD", 53, 172, 215), ("VADD", 57, 59, 75)]
    assert shallow.cycles == deep.cycles == 216


def test_allgather_starts_when_the_last_card_can():
    card0 = "LOAD dst=ABUF[96] src1=HBM[0] rows=1 n=16\nALLGATHER dst=ABUF[200] src1=ABUF[96] rows=1 n=16\nHALT"
    card1 = "ALLGATHER dst=ABUF[200] src1=ABUF[96] rows=1 n=16 k=16\nHALT"
    report = run([card0, card1])
    # Card 0's operand is there at 86 (its LOAD: 43 cycles from 43), its router takes the ALLGATHER at 88; card
    # 1's could at 43. From 88 both take 12 cycles on direct links (2-beat slices, copied into place) and a 34-cycle
    # hop: done at 134. Each router is busy from taking it to done (card 1's waits for card 0's slice).
    assert report.cards[0].timeline[1] == ("ALLGATHER", 86, 88, 134)
    assert report.cards[1].timeline[0] == ("ALLGATHER", 41, 88, 134)
    assert (report.cards[0].busy["ROUTER"], report.cards[1].busy["ROUTER"]) == (46, 91)
    assert report.cycles == 135 and report.cards[1].ring_bytes == report.cards[0].ring_bytes == 32


def test_recv_waits_for_the_matching_send_and_the_hop():
    report = run(["NOP\nSEND src1=ABUF[0] rows=1 n=16\nHALT", "RECV dst=ABUF[0] rows=1 n=16\nHALT"])
    assert report.cards[0].timeline[1] == ("SEND", 45, 47, 57)       # 4 + 2 + 2 beats + 2
    assert report.cards[1].timeline[0] == ("RECV", 41, 91, 98)       # from 57 + 34, then 4 + 1 + 2
    assert report.cards[1].busy["ROUTER"] == 98 - 43


def test_report_figures():
    report = run("LOAD dst=WBUF[0] src1=HBM[0] rows=4 n=100\nSTORE dst=HBM[1000] src1=ABUF[0] rows=1 n=64\n"
                 "STORE dst=HOST[0] src1=ABUF[0] rows=1 n=8\nHALT")
    card = report.cards[0]
    assert (card.hbm_read_bytes, card.hbm_write_bytes, card.host_bytes) == (800, 128, 16)
    # the STORE's 64 words at HBM[1000] end granule 7 and start granule 8, both on channel 2 and consecutive
    # there: 8 beats, one burst of 160 B (464..592 rounded out to 32 B): 11.1 -> 12 cycles of the channel; the host
    # STORE: one beat, but the request window (16 x 33 cycles) is 3 cycles a port
    assert card.classes == {"dma-hbm": 106 + (5 + 11 + 37), "dma-host": 5 + 2 + 37, "control": 1}
    assert card.opcodes == {"LOAD": 106, "STORE": 53 + 44, "HALT": 1}
    assert report.hbm_bytes == 928
    assert report.ms == pytest.approx(report.cycles / 1e5)
    assert report.hbm_bound_ms == pytest.approx(800 / 6.4e6)
    assert report.hbm_bound_pct == pytest.approx(100 * (800 / 6.4e9) / (report.cycles / 100e6))
    assert report.summary()["slowest_card"] == 0


def run_with_traces(texts, cfg=CFG):
    """`run`'s cycle report and the traces it was scheduled from."""
    texts = [texts] if isinstance(texts, str) else texts
    cfg = cfg.with_cards(len(texts)) if cfg.cards != len(texts) else cfg
    cards = [CardImage(Program(assemble(t), cfg.name, cfg.hash, i, cfg.cards), [], 8192, 64)
             for i, t in enumerate(texts)]
    device = SimulatorDevice(cfg)
    device.load(ApplianceImage(cfg, cards))
    device.run(0, 1)
    return device.last_report, [card.trace for card in device.cards]


def terms(report, traces):
    return [{k: c[k] for k in TERMS} for c in occupancy(report, traces)]


def test_occupancy_partitions_each_cards_cycles():
    # the LOAD holds the DMA unit 43..190 and the MATMUL (47..123) runs under it: all HBM; the fetch's first
    # 43 cycles and the HALT's one are the controller's alone
    assert terms(*run_with_traces(f"{LOAD_LONG}\n{MATMUL_BANK0}\nHALT")) == [
        {"hbm": 147, "compute": 0, "ring": 0, "host": 0, "issue": 43 + 1, "after_halt": 0}]
    # the LOAD waits for the MATMUL (43..119), taken at 121: 76 cycles of compute with HBM idle, the 2 cycles
    # in the DMA unit's queue issue
    report, traces = run_with_traces(f"{MATMUL_BANK0}\n{LOAD_LONG.replace('WBUF[4096]', 'WBUF[960]')}\nHALT")
    assert terms(report, traces) == [
        {"hbm": 147, "compute": 76, "ring": 0, "host": 0, "issue": 43 + 2 + 1, "after_halt": 0}]
    assert {k: occupancy(report, traces)[0][k] for k in COMPUTE_PARTS} == {
        "compute_matrix": 76, "compute_vector": 0, "compute_onchip": 0}
    # a VADD (43..65) beside an independent MATMUL (47..123, test_write_after_read_and_read_after_write_wait): the
    # matrix unit's cycles first, the vector unit's only where the matrix unit is idle (43..47)
    report, traces = run_with_traces("VADD dst=ABUF[200] src1=ABUF[504] src2=IMM[0x3c00] rows=1 n=64\n"
                                     f"{MATMUL_BANK0}\nHALT")
    (card,) = occupancy(report, traces)
    assert (card["compute"], card["compute_matrix"], card["compute_vector"]) == (123 - 43, 123 - 47, 47 - 43)
    # test_report_figures' program: the DMA unit serves the LOAD (106) and the HBM STORE (53) from 43, then the
    # host STORE (44) to 246; HALT 246..247. 800 bytes read at sim-small's 64 B a cycle: 12.5 cycles of bound
    report, traces = run_with_traces("LOAD dst=WBUF[0] src1=HBM[0] rows=4 n=100\nSTORE dst=HBM[1000] src1=ABUF[0] "
                                     "rows=1 n=64\nSTORE dst=HOST[0] src1=ABUF[0] rows=1 n=8\nHALT")
    (card,) = occupancy(report, traces)
    assert {k: card[k] for k in TERMS} == {"hbm": 106 + 53, "compute": 0, "ring": 0, "host": 44, "issue": 43 + 1,
                                           "after_halt": 0}
    assert (card["halt"], card["hbm_transfers"], card["hbm_read_bytes"]) == (247, 2, 800)
    assert card["hbm_bound_cycles"] == 12.5
    assert card["hbm_bound_pct"] == pytest.approx(100 * 12.5 / 247)


def test_occupancy_counts_the_routers_waits_as_the_rings():
    # test_allgather_starts_when_the_last_card_can: card 0's LOAD 43..86, its router could take the ALLGATHER at
    # 88 (86 + its queue), done at 134; card 1's router could at 43 and waits for card 0 in it. HALT 134..135
    card0 = "LOAD dst=ABUF[96] src1=HBM[0] rows=1 n=16\nALLGATHER dst=ABUF[200] src1=ABUF[96] rows=1 n=16\nHALT"
    card1 = "ALLGATHER dst=ABUF[200] src1=ABUF[96] rows=1 n=16 k=16\nHALT"
    assert terms(*run_with_traces([card0, card1])) == [
        {"hbm": 43, "compute": 0, "ring": 134 - 88, "host": 0, "issue": 43 + 2 + 1, "after_halt": 0},
        {"hbm": 0, "compute": 0, "ring": 134 - 43, "host": 0, "issue": 43 + 1, "after_halt": 0}]
    # test_recv_waits_for_the_matching_send_and_the_hop: card 0's SEND 47..57, its HALT 57..58 (drained); card 1's
    # RECV from 43 (taken at 41 + 2) to 98, its HALT 98..99: card 0 waits 41 cycles for the run's end
    sends = ["NOP\nSEND src1=ABUF[0] rows=1 n=16\nHALT", "RECV dst=ABUF[0] rows=1 n=16\nHALT"]
    assert terms(*run_with_traces(sends)) == [
        {"hbm": 0, "compute": 0, "ring": 10, "host": 0, "issue": 47 + 1, "after_halt": 99 - 58},
        {"hbm": 0, "compute": 0, "ring": 98 - 43, "host": 0, "issue": 43 + 1, "after_halt": 0}]


def test_schedule_needs_one_consistent_trace_per_card():
    with pytest.raises(ValueError, match="one trace per card"):
        schedule([[Resolved(Opcode.HALT)]], CFG.with_cards(2))
    waits = [[Resolved(Opcode.ALLGATHER, rows=1, n=1, slices=((1, 0), (1, 1))), Resolved(Opcode.HALT)],
             [Resolved(Opcode.HALT)]]
    with pytest.raises(ValueError, match="card 0 waits in ALLGATHER"):
        schedule(waits, CFG.with_cards(2))


def test_double_buffered_weight_stream_overlaps_the_matrix_unit():
    """Weights streamed through two WBUF banks: each LOAD overlaps the previous chunk's MATMUL."""
    chunks = []
    for i in range(6):
        bank = (i % 2) * 32768
        chunks.append(f"LOAD dst=WBUF[{bank}] src1=HBM[{i * 8192}] rows=1 n=8192")  # 4,096 B a channel: 5 + 284 + 36
        chunks.append(f"MATMUL dst=ABUF[{1000 + 64 * i}] src1=ABUF[0] src2=WBUF[{bank}] rows=1 n=64 k=128 "
                      "src2_stride=128")  # 4 + 16 * 16 + 33 = 293
    cfg = CFG
    cards = [CardImage(Program(assemble("\n".join(chunks) + "\nHALT"), cfg.name, cfg.hash), [], 6 * 8192, 0)]
    device = SimulatorDevice(cfg)
    device.load(ApplianceImage(cfg, cards))
    device.run(0, 1)
    report = device.last_report
    assert report.cards[0].busy["DMA"] == 6 * 325
    # MATMUL i waits in the controller for LOAD i (done, then 2 cycles to the matrix unit); LOAD i + 1 stands behind
    # it in program order, so it starts 3 cycles after LOAD i is done: one chunk every 325 + 3 cycles, the matrix
    # unit (293 a chunk) waiting for the weights.
    timeline = report.cards[0].timeline
    assert [t[2] for t in timeline if t[0] == "MATMUL"] == [370 + 328 * i for i in range(6)]
    assert report.cycles == 370 + 328 * 5 + 293 + 1
    # The bound: 6 x 16,384 bytes at the 6.4 GB/s peak is 1,536 cycles.
    assert report.hbm_bound_pct == pytest.approx(100 * 1536 / report.cycles)


def test_an_allgathers_destination_blocks_buffer_words_above_it():
    """The scoreboard takes an ALLGATHER's destination from its base up (only the router learns the other cards'
    columns): a VADD writing ABUF above it waits for the ALLGATHER, one writing below it does not."""
    gather = "ALLGATHER dst=ABUF[100] src1=ABUF[{src}] rows=1 n=8 k={k} dst_stride=16 src1_stride=16"
    for dst, decided in ((3000, 88), (0, 45)):
        vadd = f"VADD dst=ABUF[{dst}] src1=ABUF[{dst + 56}] src2=IMM[0x3c00] rows=1 n=8"
        report = run([f"{gather.format(src=100, k=0)}\n{vadd}\nHALT", f"{gather.format(src=108, k=8)}\n{vadd}\nHALT"])
        # the ALLGATHER: decided at 41, taken at 43, 11 cycles on direct links + the 34-cycle hop: done at 88
        assert report.cards[0].timeline[0] == ("ALLGATHER", 41, 43, 88)
        assert report.cards[0].timeline[1][1] == decided


def test_costed_memo_is_keyed_by_the_instruction_object_and_the_config():
    """_costed derives what the schedule needs from instruction_cost, scoreboard_ranges and instruction_class once per
    Resolved object of a run, under one config: the same object hits (from this run or the last), another instruction
    or an equal copy does not; schedule keeps each config's entries of its last run only."""
    r = Resolved(Opcode.STORE, rows=3, n=100, dst=HBM, src1=ABUF, src1_stride=100)
    last, now = {}, {}
    c = _costed(r, CFG, last, now, {})
    cost = instruction_cost(r, CFG)
    assert (c.unit, c.slot, c.kind, c.cycles, c.cls, c.op_name) == (Unit.DMA, Unit.DMA._value_, "unit", cost.cycles,
                                                                  instruction_class(r), "STORE")
    assert (c.reads, c.writes) == scoreboard_ranges(r)
    assert cost.hbm_bytes > 0
    assert (c.hbm_read_bytes, c.hbm_write_bytes, c.ring_bytes, c.host_bytes) == (0, cost.hbm_bytes, 0, 0)
    assert _costed(r, CFG, last, now, {}) is c and _costed(r, CFG, now, {}, {}) is c
    copy = Resolved(*r)
    assert _costed(copy, CFG, now, {}, {}) is not c and _costed(copy, CFG, now, {}, {}) == c
    longer = r._replace(n=300, src1_stride=300)
    assert _costed(longer, CFG, now, {}, {}).cycles == instruction_cost(longer, CFG).cycles > c.cycles
    kinds = {op: _costed(Resolved(op, rows=1, n=8, k=8, dst=ABUF, src1=ABUF, slices=((8, 0),)), CFG, {}, {}, {}).kind
             for op in (Opcode.ADDI, Opcode.BARRIER, Opcode.HALT, Opcode.ALLGATHER, Opcode.SEND, Opcode.RECV)}
    assert kinds == {Opcode.ADDI: "control", Opcode.BARRIER: "drain", Opcode.HALT: "drain",
                     Opcode.ALLGATHER: "allgather", Opcode.SEND: "send", Opcode.RECV: "recv"}
    # within a run, another card's instruction with equal fields shares the derivation, but for the router's
    alike = {}
    mine, other = Resolved(Opcode.VADD, card=0, rows=2, n=20), Resolved(Opcode.VADD, card=1, rows=2, n=20)
    assert _costed(other, CFG, {}, {}, alike) is _costed(mine, CFG, {}, {}, alike)
    sends = [Resolved(Opcode.SEND, card=c, rows=1, n=8, src1=ABUF) for c in (0, 1)]
    assert _costed(sends[1], CFG, {}, {}, alike) is not _costed(sends[0], CFG, {}, {}, alike)
    # schedule: a config's entries are those of its last run; another config has its own
    halt = Resolved(Opcode.HALT)
    one = CFG.with_cards(1)
    slow = dataclasses.replace(one, hbm_efficiency=0.1)
    assert schedule([[r, halt]], one).cycles < schedule([[r, halt]], slow).cycles
    remembered = scheduler._COSTED[id(one)]
    assert remembered[0] is one and set(remembered[1]) == {id(r), id(halt)}
    schedule([[longer, halt]], one)
    assert set(scheduler._COSTED[id(one)][1]) == {id(longer), id(halt)}


@pytest.mark.parametrize("stride", [0, 64, 64 * 3, 64 * 17, 64 * 34, 768, 1600])
def test_weight_stalls_are_the_weight_beats_count(stride):
    """With the weights in WBUF and no bias, x is alone in ABUF: the stalls are tile_read_cycles - 1 over every
    beat of the weights, once per row."""
    import numpy as np

    from ringgpt.hw.banks import tile_read_cycles
    cfg = get_config("u280")
    L, W, C, P = cfg.mpu_lanes, cfg.mac_width, cfg.buffer_chunk_words, cfg.buffer_banks
    for n, k in ((16, 64), (37, 200), (100, 1)):
        g, t, lane = np.meshgrid(np.arange(-(-n // L)), np.arange(-(-k // W)), np.arange(L), indexing="ij")
        column = g * L + lane
        counted = int((tile_read_cycles(128 + column * stride + t * W, column < n, W, C, P) - 1).sum())
        r = Resolved(Opcode.MATMUL, rows=3, n=n, k=k, src1=(Space.ABUF, 5), src1_stride=k, src2=(Space.WBUF, 128),
                     src2_stride=stride)
        assert stalls.matrix_stall_cycles(r, cfg) == 3 * counted
        assert int((stalls.weight_beat_cycles(128, stride, n, k, cfg) - 1).sum()) == counted
    all_in_one = Resolved(Opcode.MATMUL, rows=1, n=32, k=64, src2=(Space.WBUF, 0), src2_stride=64 * 17)
    assert stalls.matrix_stall_cycles(all_in_one, cfg) == 2 * 15      # all 16 lanes in one memory
