"""The cycle model: hand-computed costs for every instruction class on the sim-small preset, and the
overlap the scoreboard allows (independent units overlap, dependences wait, barriers, queue-depth
stalls, collectives across cards)."""
import dataclasses

import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Flags, Opcode, Program, Space, Unit, assemble
from ringgpt.host.image import ApplianceImage, CardImage
from ringgpt.sim.cycle_model import (Resolved, access_ranges, instruction_class, instruction_cost, schedule,
                                     unit_timing)
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
    (Resolved(Opcode.LOAD, rows=4, n=100, dst=WBUF, src1=HBM), (Unit.DMA, 14 + 32, 800, 0, 0), "dma-hbm"),
    (Resolved(Opcode.STORE, rows=1, n=64, dst=HBM, src1=ABUF), (Unit.DMA, 3 + 32, 128, 0, 0), "dma-hbm"),
    (Resolved(Opcode.GATHER, rows=2, n=768, dst=ABUF, src1=HBM, src2=HOST), (Unit.DMA, 54 + 32, 3072, 0, 0), "dma-hbm"),
    (Resolved(Opcode.STORE, rows=1, n=600, dst=HOST, src1=ABUF), (Unit.DMA, 10, 0, 0, 1200), "dma-host"),
    (Resolved(Opcode.LOAD, rows=4, n=100, dst=WBUF, src1=ABUF), (Unit.DMA, 4 * 13, 0, 0, 0), "dma-onchip"),
    (Resolved(Opcode.SEND, rows=2, n=100), (Unit.ROUTER, 50 + 4, 0, 400, 0), "ring"),
    (Resolved(Opcode.RECV, rows=2, n=100), (Unit.ROUTER, 25, 0, 0, 0), "ring"),
    (Resolved(Opcode.SETI), (Unit.CONTROL, 1, 0, 0, 0), "control"),
    (Resolved(Opcode.HALT), (Unit.CONTROL, 1, 0, 0, 0), "control"),
])
def test_hand_computed_costs(resolved, cost, cls):
    assert tuple(instruction_cost(resolved, CFG)) == cost
    assert instruction_class(resolved) == cls


def test_allgather_cost_on_a_unidirectional_ring():
    slices = ((5, 0), (3, 5), (4, 8), (2, 12))
    r = Resolved(Opcode.ALLGATHER, card=0, rows=2, n=5, slices=slices)
    # 3 steps of 50 + ceil(2 rows * 5 words * 2 B / 121); card 0 forwards all slices but card 1's.
    assert tuple(instruction_cost(r, CFG.with_cards(4))) == (Unit.ROUTER, 3 * 51, 0, 2 * 2 * (14 - 3), 0)
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


LOAD_LONG = "LOAD dst=WBUF[4096] src1=HBM[0] rows=1 n=2880"       # 5,760 B: 100 + 32 = 132 cycles
MATMUL_BANK0 = "MATMUL dst=ABUF[0] src1=ABUF[100] src2=WBUF[0] rows=1 n=16 k=64 src2_stride=64"  # 4 + (7 * 5 + 4) + 41 = 84


def test_independent_dma_overlaps_matmul():
    report = run(f"{LOAD_LONG}\n{MATMUL_BANK0}\nHALT")
    assert report.cards[0].timeline == [("LOAD", 0, 1, 133), ("MATMUL", 1, 2, 86), ("HALT", 133, 133, 134)]
    assert report.cycles == 134
    assert report.cards[0].busy == {"DMA": 132, "MATRIX": 84, "CONTROL": 1}


def test_dependent_matmul_waits_for_its_weights():
    report = run(f"{LOAD_LONG}\n{MATMUL_BANK0.replace('WBUF[0]', 'WBUF[4096]')}\nHALT")
    assert report.cards[0].timeline[1] == ("MATMUL", 1, 133, 217)
    assert report.cycles == 218


def test_write_after_read_and_read_after_write_wait():
    war = run(f"{MATMUL_BANK0}\n{LOAD_LONG.replace('WBUF[4096]', 'WBUF[960]')}\nHALT")
    assert war.cards[0].timeline[:2] == [("MATMUL", 0, 1, 85), ("LOAD", 1, 85, 217)]
    raw = run("VADD dst=ABUF[100] src1=ABUF[500] src2=IMM[0x3c00] rows=1 n=64\n" + MATMUL_BANK0 + "\nHALT")
    assert raw.cards[0].timeline[:2] == [("VADD", 0, 1, 23), ("MATMUL", 1, 23, 107)]
    independent = run("VADD dst=ABUF[200] src1=ABUF[500] src2=IMM[0x3c00] rows=1 n=64\n" + MATMUL_BANK0 + "\nHALT")
    assert independent.cards[0].timeline[1] == ("MATMUL", 1, 2, 86)


def test_barrier_waits_for_everything_issued_before_it():
    report = run(f"{LOAD_LONG}\nBARRIER\n{MATMUL_BANK0}\nHALT")
    assert report.cards[0].timeline == [("LOAD", 0, 1, 133), ("BARRIER", 133, 133, 134), ("MATMUL", 134, 135, 219),
                                        ("HALT", 219, 219, 220)]


def test_full_unit_queue_stalls_the_decoder():
    loads = "\n".join(f"LOAD dst=ABUF[{1000 + 16 * i}] src1=HBM[{16 * i}] rows=1 n=16" for i in range(4))  # 33 cycles
    text = f"{loads}\nVADD dst=ABUF[0] src1=ABUF[500] src2=IMM[0x3c00] rows=1 n=16\nHALT"          # 16 cycles
    shallow = run(text, dataclasses.replace(CFG, queue_depth=2))
    assert shallow.cards[0].timeline[:5] == [("LOAD", 0, 1, 34), ("LOAD", 1, 34, 67), ("LOAD", 2, 67, 100),
                                             ("LOAD", 34, 100, 133), ("VADD", 35, 36, 52)]
    deep = run(text)
    assert deep.cards[0].timeline[4] == ("VADD", 4, 5, 21)
    assert shallow.cycles == deep.cycles == 134


def test_allgather_starts_when_the_last_card_can():
    card0 = "LOAD dst=ABUF[100] src1=HBM[0] rows=1 n=16\nALLGATHER dst=ABUF[200] src1=ABUF[100] rows=1 n=16\nHALT"
    card1 = "ALLGATHER dst=ABUF[200] src1=ABUF[100] rows=1 n=16 k=16\nHALT"
    report = run([card0, card1])
    # One step: 50 + ceil(32 B / 121) = 51 cycles, from cycle 34 when card 0's operand has arrived.
    assert report.cards[0].timeline[1] == ("ALLGATHER", 1, 34, 85)
    assert report.cards[1].timeline[0] == ("ALLGATHER", 0, 34, 85)
    assert report.cycles == 86 and report.cards[1].ring_bytes == report.cards[0].ring_bytes == 32


def test_recv_waits_for_the_matching_send():
    report = run(["NOP\nSEND src1=ABUF[0] rows=1 n=16\nHALT", "RECV dst=ABUF[0] rows=1 n=16\nHALT"])
    assert report.cards[0].timeline[1] == ("SEND", 1, 2, 53)
    assert report.cards[1].timeline[0] == ("RECV", 0, 53, 55)


def test_report_figures():
    report = run("LOAD dst=WBUF[0] src1=HBM[0] rows=4 n=100\nSTORE dst=HBM[1000] src1=ABUF[0] rows=1 n=64\n"
                 "STORE dst=HOST[0] src1=ABUF[0] rows=1 n=8\nHALT")
    card = report.cards[0]
    assert (card.hbm_read_bytes, card.hbm_write_bytes, card.host_bytes) == (800, 128, 16)
    assert card.classes == {"dma-hbm": 46 + 35, "dma-host": 1, "control": 1}
    assert card.opcodes == {"LOAD": 46, "STORE": 36, "HALT": 1}
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


def test_double_buffered_weight_stream_is_bound_by_the_dma():
    """Weights streamed through two WBUF banks: each LOAD overlaps the previous chunk's MATMUL, so
    the run takes the stream's time plus the last MATMUL."""
    chunks = []
    for i in range(6):
        bank = (i % 2) * 32768
        chunks.append(f"LOAD dst=WBUF[{bank}] src1=HBM[{i * 8192}] rows=1 n=8192")  # ceil(16384 / 57.6) + 32 = 317
        chunks.append(f"MATMUL dst=ABUF[{1000 + 64 * i}] src1=ABUF[0] src2=WBUF[{bank}] rows=1 n=64 k=128 "
                      "src2_stride=128")  # 4 + 16 * 16 + 41 = 301
    cfg = CFG
    cards = [CardImage(Program(assemble("\n".join(chunks) + "\nHALT"), cfg.name, cfg.hash), [], 6 * 8192, 0)]
    device = SimulatorDevice(cfg)
    device.load(ApplianceImage(cfg, cards))
    device.run(0, 1)
    report = device.last_report
    assert report.cards[0].busy["DMA"] == 6 * 317
    assert report.cycles == 1 + 6 * 317 + 301 + 1
    # The bound: 6 x 16,384 bytes at the 6.4 GB/s peak is 1,536 cycles.
    assert report.hbm_bound_pct == pytest.approx(100 * 1536 / report.cycles)
