"""The on-chip DMA (hw/core/dma.py) in the single-instruction harness against the functional simulator,
on Verilator and Icarus: every word of ABUF and WBUF after each instruction."""
import os

import pytest

from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.core.dma import OnChipDMA, onchip_cycles
from ringgpt.sim.cocotb_support.runner import Design

DESIGN = Design.of("ringgpt.hw.core.datapath:Datapath", unit="dma")
INSTRUCTIONS = {"verilator": 120, "icarus": 24}


def test_cycles_formula():
    cfg = small_config(abuf_words=2048, wbuf_words=1024)
    unit = OnChipDMA(cfg)
    unit._MustUse__silence = True
    P = unit.width
    assert (unit.latency, unit.drain_latency, unit.overhead) == (2, 1, 4)
    assert unit.cycles(3, 2 * P + 1, False) == 4 + 3 * 3 + 2
    # transposed: per (row group, column chunk) R fill steps, 1 wait, C drain steps
    assert unit.cycles(1, P + 1, True) == 4 + (1 + 1 + P) + (1 + 1 + 1) + 1
    assert unit.cycles(P + 1, 1, True) == 4 + (P + 1 + 1) + (1 + 1 + 1) + 1
    assert unit.cycles(0, 5, True) == unit.overhead
    assert onchip_cycles(cfg, 3, 2 * P + 1, False) == unit.cycles(3, 2 * P + 1, False)


@pytest.mark.rtl
def test_dma_bit_exact(run_tb, sim):
    run_tb(DESIGN, "ringgpt.sim.tb.tb_dma", seed=5, instructions=INSTRUCTIONS[sim], issue_valid_probability=0.5,
           record=os.environ.get("RINGGPT_CYCLE_RECORD"))
