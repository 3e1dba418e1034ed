"""The cycle model: hand-computed costs for every instruction class on the sim-small preset, and the
overlap the scoreboard allows (independent units overlap, dependences wait, barriers, queue-depth
stalls, collectives across cards)."""
import dataclasses

import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Flags, Opcode, Program, Space, Unit, assemble
from ringgpt.host.image import ApplianceImage, CardImage
from ringgpt.hw.resolved import Resolved, access_ranges
from ringgpt.sim.cycle_model import instruction_class, instruction_cost, schedule, unit_timing
from ringgpt.sim.functional import SimulatorDevice

CFG = get_config("sim-small")


def test_the_preset_figures_these_costs_assume():
    # mac 8 x 4 lanes, 8 vector lanes, HBM 57.6 B/cycle + 32 cycles, host 120 B/cycle, ring 121 B/cycle + 50.
    assert (CFG.mac_width, CFG.mpu_lanes, CFG.vector_width) == (8, 4, 8)
    assert CFG.hbm_bytes_per_cycle == pytest.approx(57.6) and CFG.hbm_latency_cycles == 32
    assert CFG.ring_bytes_per_cycle == pytest.approx(121.0) and CFG.ring_latency_cycles == 50
    assert CFG.queue_depth == 8
    # pipeline depths and overheads come from the RTL units (hw/core), not from the config
    assert unit_timing(CFG) == {"matrix": {"latency": 41, "row_max": 2, "overhead": 4, "loop": 5},
                                "vector": {"latency": {"elementwise": 10, "sum": 26, "max": 4}, "overhead": 4,
                                           "loop": 5}}


ABUF, WBUF, HBM, HOST = ((s, 0) for s in (Space.ABUF, Space.WBUF, Space.HBM, Space.HOST))


@pytest.mark.parametrize("resolved,cost,cls", [
    (Resolved(Opcode.MATMUL, rows=3, n=40, k=100, dst=ABUF, src1=ABUF, src2=WBUF),
     (Unit.MATRIX, 4 + 3 * 13 * 10 + 41, 0, 0, 0), "matrix"),
    (Resolved(Opcode.MASKED_QK, rows=2, n=9, k=64), (Unit.MATRIX, 4 + 2 * 8 * 3 + 41 + 2, 0, 0, 0), "matrix"),
    (Resolved(Opcode.VADD, rows=2, n=20), (Unit.VECTOR, 4 + 2 * 3 + 10, 0, 0, 0), "vector"),
    (Resolved(Opcode.VSUM, rows=5, n=8), (Unit.VECTOR, 4 + 5 + 26, 0, 0, 0), "vector"),
    # a single row's sum waits for the accumulator's adder loop (5 cycles) between chunks
    (Resolved(Opcode.VSUM, rows=1, n=24), (Unit.VECTOR, 4 + 2 * 5 + 1 + 26, 0, 0, 0), "vector"),
    (Resolved(Opcode.MATMUL, rows=1, n=4, k=24), (Unit.MATRIX, 4 + 2 * 5 + 1 + 41, 0, 0, 0), "matrix"),
    # HBM (tests/test_hbm_model.py has one test per effect): 4 rows of 100 words all at word 0 (stride 0) are 4
    # bursts of 224 bytes (200 rounded to 32-byte accesses) on channel 0: 896 / 14.4 B/cycle + 3 page misses of
    # 1 cycle = 65.2 -> 66; the request latency (32) is Cost.latency, not unit time.
    (Resolved(Opcode.LOAD, rows=4, n=100, dst=WBUF, src1=HBM), (Unit.DMA, 66, 800, 0, 0), "dma-hbm"),
    (Resolved(Opcode.STORE, rows=1, n=64, dst=HBM, src1=ABUF), (Unit.DMA, 9, 128, 0, 0), "dma-hbm"),  # 128 / 14.4
    # 2 rows of 6 granules each, every granule a burst: 3 per channel, 768 / 14.4 + 2 misses = 55.3 -> 56
    (Resolved(Opcode.GATHER, rows=2, n=768, dst=ABUF, src1=HBM, src2=HOST), (Unit.DMA, 56, 3072, 0, 0), "dma-hbm"),
    (Resolved(Opcode.STORE, rows=1, n=600, dst=HOST, src1=ABUF), (Unit.DMA, 10, 0, 0, 1200), "dma-host"),
    # on chip, the RTL's count (hw/core/dma.py): overhead 4 + one step per 8-word chunk + latency 2; transposed
    # through the 8 x 8 tile: 13 chunks x (4 fill + 1 wait) + 100 drain steps, + overhead 4 + drain latency 1
    (Resolved(Opcode.LOAD, rows=4, n=100, dst=WBUF, src1=ABUF), (Unit.DMA, 4 + 4 * 13 + 2, 0, 0, 0), "dma-onchip"),
    (Resolved(Opcode.LOAD, rows=4, n=100, dst=ABUF, src1=ABUF, flags=Flags(transpose=1)),
     (Unit.DMA, 4 + 13 * 5 + 100 + 1, 0, 0, 0), "dma-onchip"),
    (Resolved(Opcode.SEND, rows=2, n=100), (Unit.ROUTER, 50 + 4, 0, 400, 0), "ring"),
    (Resolved(Opcode.RECV, rows=2, n=100), (Unit.ROUTER, 25, 0, 0, 0), "ring"),
    (Resolved(Opcode.SETI), (Unit.CONTROL, 1, 0, 0, 0), "control"),
    (Resolved(Opcode.HALT), (Unit.CONTROL, 1, 0, 0, 0), "control"),
])
def test_hand_computed_costs(resolved, cost, cls):
    assert tuple(instruction_cost(resolved, CFG))[:5] == cost
    assert instruction_cost(resolved, CFG).latency == (CFG.hbm_latency_cycles if cls == "dma-hbm" else 0)
    assert instruction_class(resolved) == cls


def test_allgather_cost_on_a_unidirectional_ring():
    slices = ((5, 0), (3, 5), (4, 8), (2, 12))
    r = Resolved(Opcode.ALLGATHER, card=0, rows=2, n=5, slices=slices)
    # 3 steps of 50 + ceil(2 rows * 5 words * 2 B / 121); card 0 forwards all slices but card 1's.
    assert tuple(instruction_cost(r, CFG.with_cards(4)))[:5] == (Unit.ROUTER, 3 * 51, 0, 2 * 2 * (14 - 3), 0)
    big = r._replace(rows=200)  # 2,000-byte largest slice: 17 cycles on the link per step
    assert instruction_cost(big, CFG.with_cards(4)).cycles == 3 * (50 + 17)
    assert instruction_cost(r._replace(slices=((5, 0),)), CFG).cycles == 0


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
    texts = [texts] if isinstance(texts, str) else texts
    cfg = cfg.with_cards(len(texts)) if cfg.cards != len(texts) else cfg
    cards = [CardImage(Program(assemble(t), cfg.name, cfg.hash, i, cfg.cards), [], 8192, 64)
             for i, t in enumerate(texts)]
    device = SimulatorDevice(cfg)
    device.load(ApplianceImage(cfg, cards))
    device.run(0, 1)
    return device.last_report


LOAD_LONG = "LOAD dst=WBUF[4096] src1=HBM[0] rows=1 n=2880"
# 5,760 B = 22.5 granules of 256 B over 4 channels (XOR interleave): channels 0 and 1 get 6 granules, 1,536 B:
# 1536 / 14.4 B/cycle = 106.7 -> 107 cycles on the DMA unit, the data there 32 cycles of latency later.
MATMUL_BANK0 = "MATMUL dst=ABUF[0] src1=ABUF[100] src2=WBUF[0] rows=1 n=16 k=64 src2_stride=64"  # 4 + (7 * 5 + 4) + 41 = 84


def test_independent_dma_overlaps_matmul():
    report = run(f"{LOAD_LONG}\n{MATMUL_BANK0}\nHALT")
    assert report.cards[0].timeline == [("LOAD", 0, 1, 140), ("MATMUL", 1, 2, 86), ("HALT", 140, 140, 141)]
    assert report.cycles == 141
    assert report.cards[0].busy == {"DMA": 107, "MATRIX": 84, "CONTROL": 1}


def test_dependent_matmul_waits_for_its_weights():
    report = run(f"{LOAD_LONG}\n{MATMUL_BANK0.replace('WBUF[0]', 'WBUF[4096]')}\nHALT")
    assert report.cards[0].timeline[1] == ("MATMUL", 1, 140, 224)
    assert report.cycles == 225


def test_write_after_read_and_read_after_write_wait():
    war = run(f"{MATMUL_BANK0}\n{LOAD_LONG.replace('WBUF[4096]', 'WBUF[960]')}\nHALT")
    assert war.cards[0].timeline[:2] == [("MATMUL", 0, 1, 85), ("LOAD", 1, 85, 224)]
    raw = run("VADD dst=ABUF[100] src1=ABUF[500] src2=IMM[0x3c00] rows=1 n=64\n" + MATMUL_BANK0 + "\nHALT")
    assert raw.cards[0].timeline[:2] == [("VADD", 0, 1, 23), ("MATMUL", 1, 23, 107)]
    independent = run("VADD dst=ABUF[200] src1=ABUF[500] src2=IMM[0x3c00] rows=1 n=64\n" + MATMUL_BANK0 + "\nHALT")
    assert independent.cards[0].timeline[1] == ("MATMUL", 1, 2, 86)


def test_barrier_waits_for_everything_issued_before_it():
    report = run(f"{LOAD_LONG}\nBARRIER\n{MATMUL_BANK0}\nHALT")
    assert report.cards[0].timeline == [("LOAD", 0, 1, 140), ("BARRIER", 140, 140, 141), ("MATMUL", 141, 142, 226),
                                        ("HALT", 226, 226, 227)]


def test_full_unit_queue_stalls_the_decoder():
    # 32 B on channel 0: 3 cycles on the unit, 32 more until the data is there
    loads = "\n".join(f"LOAD dst=ABUF[{1000 + 16 * i}] src1=HBM[{16 * i}] rows=1 n=16" for i in range(4))
    text = f"{loads}\nVADD dst=ABUF[0] src1=ABUF[500] src2=IMM[0x3c00] rows=1 n=16\nHALT"          # 16 cycles
    shallow = run(text, dataclasses.replace(CFG, queue_depth=2))
    assert shallow.cards[0].timeline[:5] == [("LOAD", 0, 1, 36), ("LOAD", 1, 4, 39), ("LOAD", 2, 7, 42),
                                             ("LOAD", 4, 10, 45), ("VADD", 5, 6, 22)]
    deep = run(text)
    assert deep.cards[0].timeline[4] == ("VADD", 4, 5, 21)
    assert shallow.cycles == deep.cycles == 46


def test_allgather_starts_when_the_last_card_can():
    card0 = "LOAD dst=ABUF[100] src1=HBM[0] rows=1 n=16\nALLGATHER dst=ABUF[200] src1=ABUF[100] rows=1 n=16\nHALT"
    card1 = "ALLGATHER dst=ABUF[200] src1=ABUF[100] rows=1 n=16 k=16\nHALT"
    report = run([card0, card1])
    # One step: 50 + ceil(32 B / 121) = 51 cycles, from cycle 36 when card 0's operand has arrived (1 + 3 + 32).
    assert report.cards[0].timeline[1] == ("ALLGATHER", 1, 36, 87)
    assert report.cards[1].timeline[0] == ("ALLGATHER", 0, 36, 87)
    assert report.cycles == 88 and report.cards[1].ring_bytes == report.cards[0].ring_bytes == 32


def test_recv_waits_for_the_matching_send():
    report = run(["NOP\nSEND src1=ABUF[0] rows=1 n=16\nHALT", "RECV dst=ABUF[0] rows=1 n=16\nHALT"])
    assert report.cards[0].timeline[1] == ("SEND", 1, 2, 53)
    assert report.cards[1].timeline[0] == ("RECV", 0, 53, 55)


def test_report_figures():
    report = run("LOAD dst=WBUF[0] src1=HBM[0] rows=4 n=100\nSTORE dst=HBM[1000] src1=ABUF[0] rows=1 n=64\n"
                 "STORE dst=HOST[0] src1=ABUF[0] rows=1 n=8\nHALT")
    card = report.cards[0]
    assert (card.hbm_read_bytes, card.hbm_write_bytes, card.host_bytes) == (800, 128, 16)
    # the STORE's 64 words at HBM[1000] end granule 7 and start granule 8, both on channel 2 and consecutive
    # there: one burst of 160 B (464..592 rounded out to 32 B): 11.1 -> 12 cycles
    assert card.classes == {"dma-hbm": 66 + 12, "dma-host": 1, "control": 1}
    assert card.opcodes == {"LOAD": 66, "STORE": 13, "HALT": 1}
    assert report.hbm_bytes == 928
    assert report.ms == pytest.approx(report.cycles / 1e5)
    assert report.hbm_bound_ms == pytest.approx(800 / 6.4e6)
    assert report.hbm_bound_pct == pytest.approx(100 * (800 / 6.4e9) / (report.cycles / 100e6))
    assert report.summary()["slowest_card"] == 0


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
        chunks.append(f"LOAD dst=WBUF[{bank}] src1=HBM[{i * 8192}] rows=1 n=8192")  # 4096 B a channel: 285 + 32
        chunks.append(f"MATMUL dst=ABUF[{1000 + 64 * i}] src1=ABUF[0] src2=WBUF[{bank}] rows=1 n=64 k=128 "
                      "src2_stride=128")  # 4 + 16 * 16 + 41 = 301
    cfg = CFG
    cards = [CardImage(Program(assemble("\n".join(chunks) + "\nHALT"), cfg.name, cfg.hash), [], 6 * 8192, 0)]
    device = SimulatorDevice(cfg)
    device.load(ApplianceImage(cfg, cards))
    device.run(0, 1)
    report = device.last_report
    assert report.cards[0].busy["DMA"] == 6 * 285
    # Chunk i + 2's LOAD waits for chunk i's MATMUL (its slot), then 285 + 32 cycles: from chunk 2 on each MATMUL
    # starts when that LOAD is done, 317 cycles after the MATMUL two before it ended (matrix unit: 301 a chunk).
    timeline = report.cards[0].timeline
    assert [t[2] for t in timeline if t[0] == "MATMUL"] == [318, 619, 936, 1237, 1554, 1855]
    assert report.cycles == 1855 + 301 + 1
    # The bound: 6 x 16,384 bytes at the 6.4 GB/s peak is 1,536 cycles.
    assert report.hbm_bound_pct == pytest.approx(100 * 1536 / report.cycles)
