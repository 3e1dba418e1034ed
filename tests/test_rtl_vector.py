"""The vector unit (hw/core/vector.py) in the single-instruction harness against the functional
simulator, on Verilator and Icarus: every word of ABUF and WBUF after each instruction."""
import os

import pytest

from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.core.vector import VectorUnit
from ringgpt.sim.cocotb_support.runner import Design

DESIGN = Design.of("ringgpt.hw.core.datapath:Datapath", unit="vector")
INSTRUCTIONS = {"verilator": 220, "icarus": 33}


def test_latency_from_the_parts():
    unit = VectorUnit(small_config(abuf_words=2048, wbuf_words=1024))
    # elementwise: read 1 + multiply 2 + add 5 + FP16 2; sum: read 1 + MAC tree 9 + accumulator 6 + FP16 2
    assert unit.latency == {"elementwise": 10, "sum": 18, "max": 4}


@pytest.mark.rtl
def test_vector_unit_bit_exact(run_tb, sim):
    run_tb(DESIGN, "ringgpt.sim.tb.tb_vector", seed=4, instructions=INSTRUCTIONS[sim],
           issue_valid_probability=0.5, record=os.environ.get("RINGGPT_CYCLE_RECORD"))
