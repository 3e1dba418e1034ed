"""sim/cycle_model/shared_reads.py: the DMA unit's ABUF reads (a STORE's beats or words, an on-chip copy's chunks)
take their memories before the vector and matrix units' tile reads, which wait, frozen, as ABUF grants them
(hw/core/buffers.py); with that the cycle model equals the whole u280 core's recorded decode runs unit by unit."""
import json
from pathlib import Path

import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.core.timing import PortTiming
from ringgpt.hw.isa import Flags, Opcode, Space
from ringgpt.hw.resolved import Resolved
from ringgpt.sim.cycle_model.shared_reads import READ_START, STORE_READ_START, abuf_reads, blocked_cycles
from ringgpt.sim.rtl_comparison import SimulatorSide, stale_because

from test_cycle_model import run_with_traces

CFG = get_config("sim-small")           # 8-word chunks and beats, 5 memories: word a in memory a // 8 mod 5
RECORD = Path(__file__).resolve().parents[1] / "docs" / "bench" / "rtl_u280.json"

# 64 one-word rows 40 words (5 chunks) apart: every read of the STORE takes memory 0, one a cycle
STORE_ON_MEMORY_0 = "STORE dst=HBM[0] src1=ABUF[0] rows=64 n=1 dst_stride=8 src1_stride=40"


def test_the_reads_of_a_store_and_of_on_chip_copies():
    store = Resolved(Opcode.STORE, rows=1, n=20, dst=(Space.HBM, 4), src1=(Space.ABUF, 84), dst_stride=20)
    times, masks = (a.tolist() for a in abuf_reads(store, CFG))
    # the row (HBM words 4..23) in the beats at 0, 8, 16: each read at the ABUF word of its lane 0, 80, 88, 96, 8
    # words wide (the unit's read: vector_width, the beat), one chunk each as each starts one
    assert (times, masks) == (list(range(STORE_READ_START, STORE_READ_START + 3)), [1 << 0, 1 << 1, 1 << 2])
    transposed = store._replace(n=3, dst_stride=16, src1=(Space.ABUF, 83), flags=Flags(transpose=1))
    # a job a word: HBM words 4, 20, 36 (lanes 4, 4, 4) from ABUF 83, 84, 85: reads at 79, 80, 81
    assert [a.tolist() for a in abuf_reads(transposed, CFG)] == [
        [STORE_READ_START, STORE_READ_START + 1, STORE_READ_START + 2], [(1 << 4) | (1 << 0), 1 << 0, (1 << 0) | (1 << 1)]]
    copy = Resolved(Opcode.LOAD, rows=2, n=12, dst=(Space.WBUF, 0), src1=(Space.ABUF, 40), src1_stride=16)
    # rows at 40 and 56, two chunks of 8 words each: 40, 48, 56, 64 (memories 0, 1, 2, 3)
    assert [a.tolist() for a in abuf_reads(copy, CFG)] == [list(range(READ_START, READ_START + 4)), [1, 2, 4, 8]]
    assert PortTiming.request_cycles == STORE_READ_START - READ_START


@pytest.mark.parametrize("unit", ["VADD dst=ABUF[3000] src1=ABUF[{}] src2=IMM[0x3c00] rows=1 n=8",
                                  "MATMUL dst=ABUF[3000] src1=ABUF[{}] src2=WBUF[0] rows=1 n=4 k=8 src2_stride=8"])
def test_a_unit_whose_operand_the_store_reads_waits_for_the_reads_to_leave_its_memory(unit):
    def run(address):
        report, _ = run_with_traces(f"{STORE_ON_MEMORY_0}\n{unit.format(address)}\nHALT")
        (_, _, store, _), (_, _, start, done) = report.cards[0].timeline[:2]
        return store, start, done
    store, start, free = run(208)                                   # memory 1: nothing in its way
    _, _, waited = run(200)                                         # memory 0
    last_read = store + STORE_READ_START + 63
    assert waited - free == last_read + 1 - (start + READ_START) > 0


def test_a_step_waits_only_while_a_reader_takes_one_of_its_memories():
    vadd = Resolved(Opcode.VADD, rows=1, n=24, dst=(Space.ABUF, 3000), src1=(Space.ABUF, 0),
                    src2=(Space.IMM, 0x3c00))            # steps of 8 words at 0, 8, 16: memories 0, 1, 2 at 2, 3, 4
    copy = Resolved(Opcode.LOAD, rows=1, n=8, dst=(Space.WBUF, 0), src1=(Space.ABUF, 8))  # memory 1 at READ_START
    assert blocked_cycles(0, vadd, [(0, copy)], CFG) == 0            # the copy's read (2) before the step's (3)
    assert blocked_cycles(0, vadd, [(1, copy)], CFG) == 1            # both at 3: the step reads at 4
    assert blocked_cycles(0, vadd, [(2, copy)], CFG) == 0


@pytest.mark.parametrize("cards", [1, 2])
def test_the_model_follows_the_u280_cores_recorded_decode_runs(cards):
    """The records of `python scripts/rtl_u280.py --cards 1` and `--cards 2` (one layer of GPT-2 345M's width on the
    whole u280 core, one card and a ring of two): the model's vector and matrix busy cycles of each decode run
    equal the RTL's, its cycles within 1 % (one card: +0.1 %; two: +0.7 %, the ring's). Skipped while a record is
    not today's (its RTL sources or compiled image changed)."""
    entry = next(e for e in json.loads(RECORD.read_text())["runs"] if e["cards"] == cards)
    config = get_config("u280", cards)
    if stale_because(entry, config):
        pytest.skip(f"the record is stale: {stale_because(entry, config)}")
    side = SimulatorSide(config, entry["model"], prompt_tokens=entry["prompt_tokens"],
                         decode_runs=entry["decode_runs"], max_context=entry["max_context"], weights=entry["weights"])
    for rtl_cards, model_cards in list(zip(entry["rtl_cards"], side.cards))[1:]:
        for rtl, model in zip(rtl_cards, model_cards):
            assert {u: model[1][u] for u in ("vector", "matrix")} == {u: rtl[1][u] for u in ("vector", "matrix")}
            assert abs(model[0] - rtl[0]) <= 0.01 * rtl[0], (model, rtl)
