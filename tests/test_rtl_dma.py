"""The DMA unit (hw/core/dma.py) in the single-instruction harness against the functional simulator, on
Verilator and Icarus, with cocotbext-axi AxiRams as HBM channels and host buffer under random AXI pauses:
every word of ABUF, WBUF, HBM and the host buffer after each instruction."""
import dataclasses
import os

import numpy as np
import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.core.timing import DMATiming, dma_timing, onchip_cycles
from ringgpt.hw.hbm import hbm_location, hbm_word, local_range
from ringgpt.hw.isa import Flags, Opcode, Space
from ringgpt.hw.resolved import Resolved
from ringgpt.sim.cocotb_support.runner import Design

DESIGN = Design.of("ringgpt.hw.core.datapath:Datapath", unit="dma")
INSTRUCTIONS = {"verilator": 60, "icarus": 12}
OFFCHIP = {"verilator": 60, "icarus": 20}


def _unit(cfg) -> DMATiming:
    return dma_timing(cfg)


def test_cycles_formula():
    cfg = small_config(abuf_words=2048, wbuf_words=1024)
    unit = _unit(cfg)
    P = unit.width
    assert (unit.latency, unit.drain_latency, unit.overhead) == (2, 1, 4)
    assert unit.cycles(3, 2 * P + 1, False) == 4 + 3 * 3 + 2
    # transposed: per (row group, column chunk) R fill steps, 1 wait, C drain steps
    assert unit.cycles(1, P + 1, True) == 4 + (1 + 1 + P) + (1 + 1 + 1) + 1
    assert unit.cycles(P + 1, 1, True) == 4 + (P + 1 + 1) + (1 + 1 + 1) + 1
    assert unit.cycles(0, 5, True) == unit.overhead
    assert onchip_cycles(cfg, 3, 2 * P + 1, False) == unit.cycles(3, 2 * P + 1, False)


def test_transfer_estimate_by_hand():
    """sim-small: 4 channels of 8-word beats, granule 128 words; memory latency 10. Reads: overhead 4, the job
    1, its burst request 3, latency 10, one beat a cycle, the write 1."""
    cfg = small_config(abuf_words=2048, wbuf_words=1024)
    unit = _unit(cfg)
    hbm = (Space.HBM, 0)
    # 4,096 words from 0: 1,024 a channel = 128 beats, one burst each (bases page aligned)
    seq = Resolved(Opcode.LOAD, rows=1, n=4096, dst=(Space.ABUF, 0), src1=hbm)
    assert unit.transfer_cycles(seq, latency=10) == 4 + 1 + 3 + 10 + 128 - 1 + 1
    # 64 rows of 8 words a stripe (512 words) apart: 16 one-beat bursts a channel, 16 in flight per 11 cycles,
    # but 64 jobs, one a cycle
    rows = Resolved(Opcode.LOAD, rows=64, n=8, src1_stride=512, dst=(Space.ABUF, 0), src1=hbm)
    assert unit.transfer_cycles(rows, latency=10) == 4 + 1 + 3 + 10 + 64 - 1 + 1
    # a transposed STORE of 3 x 5 words: one job per word; the last one's W beat 2 cycles after its request,
    # its B response 10 after that
    store = Resolved(Opcode.STORE, rows=3, n=5, dst=hbm, src1=(Space.ABUF, 0), dst_stride=100,
                     flags=Flags(transpose=1))
    assert unit.transfer_cycles(store, latency=10) == 4 + 1 + 15 - 1 + 3 + 2 + 10


def test_hbm_map_is_one_permutation_with_contiguous_channel_ranges():
    for name, channels in (("sim-small", 4), ("u280", 32)):
        cfg = get_config(name)
        words = np.arange(64 * cfg.hbm_interleave_words * channels)
        channel, local = hbm_location(words, cfg)
        assert (hbm_word(channel, local, cfg) == words).all()
        granule = words // cfg.hbm_interleave_words
        assert (channel == (granule % channels) ^ ((granule // channels) % channels)).all()
        assert (local == (granule // channels) * cfg.hbm_interleave_words + words % cfg.hbm_interleave_words).all()
        rng = np.random.default_rng(0)
        for _ in range(300):
            lo = int(rng.integers(0, len(words) // 2))
            hi = lo + int(rng.integers(1, len(words) // 2))
            for c in rng.integers(0, channels, 4):
                llo, lhi = local_range(int(c), lo, hi, cfg)
                mine = np.sort(local[(channel == c) & (words >= lo) & (words < hi)])
                assert (llo, lhi) == ((mine[0], mine[-1] + 1) if len(mine) else (llo, lhi))
                assert max(lhi - llo, 0) == len(mine)
    odd = dataclasses.replace(get_config("sim-small"), hbm_channels=3, hbm_channel_mbytes=1)
    words = np.arange(3 * 128 * 9)
    assert (hbm_word(*hbm_location(words, odd), odd) == words).all()


def test_rtl_map_matches_python():
    """hw/hbm.py's Amaranth map (word_of, local_range_of) against its Python map, in Amaranth's simulator."""
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator

    from ringgpt.hw.hbm import local_range_of, word_of
    cfg = get_config("sim-small")
    C, G = cfg.hbm_channels, cfg.hbm_interleave_words
    m = Module()
    lo, hi, local = Signal(33), Signal(33), Signal(33)
    ranges = [local_range_of(m, c, lo, hi, C, G, name=f"c{c}") for c in range(C)]
    words = []
    for c in range(C):
        word = Signal(32, name=f"word{c}")
        m.d.comb += word.eq(word_of(c, local, C, G))
        words.append(word)
    rng = np.random.default_rng(1)
    cases = [(int(a), int(a) + int(b), int(w)) for a, b, w in zip(rng.integers(0, 1 << 32, 150),
                                                                   rng.integers(1, 1 << 12, 150),
                                                                   rng.integers(0, 1 << 30, 150))]
    cases += [(0, 1, 0), ((1 << 32) - 1, 1 << 32, (1 << 30) - 1), (5 * G - 1, 9 * G + 1, G)]
    wrong = []

    async def testbench(ctx):
        for a, b, w in cases:
            ctx.set(lo, a)
            ctx.set(hi, b)
            ctx.set(local, w)
            for c in range(C):
                llo, lhi = local_range(c, a, b, cfg)
                got = (ctx.get(ranges[c][0]), ctx.get(ranges[c][1]))
                if (got if got[0] < got[1] else None) != ((llo, lhi) if llo < lhi else None):
                    wrong.append(("range", c, a, b, got, (llo, lhi)))
                if ctx.get(words[c]) != hbm_word(c, w, cfg) % (1 << 32):
                    wrong.append(("word", c, w, ctx.get(words[c]), hbm_word(c, w, cfg)))

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    assert not wrong, wrong[:5]


@pytest.mark.rtl
def test_dma_bit_exact(run_tb, sim):
    run_tb(DESIGN, "ringgpt.sim.tb.tb_dma", seed=5, instructions=INSTRUCTIONS[sim], offchip=OFFCHIP[sim],
           issue_valid_probability=0.5, axi_pause=0.3, record=os.environ.get("RINGGPT_CYCLE_RECORD"))
