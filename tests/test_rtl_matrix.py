"""The matrix unit (hw/core/matrix.py) in the single-instruction harness against the functional
simulator, on Verilator and Icarus: every word of ABUF and WBUF after each instruction."""
import os

import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.core.matrix import MatrixUnit
from ringgpt.sim.cocotb_support.runner import Design

DESIGN = Design.of("ringgpt.hw.core.datapath:Datapath", unit="matrix")
INSTRUCTIONS = {"verilator": 150, "icarus": 20}


def test_latency_from_the_parts():
    unit = MatrixUnit(small_config(abuf_words=2048, wbuf_words=1024))
    # read 1, MAC tree 5 + 2 * ceil(log2(8) / 2), accumulator 6, bias read 1 + FP16->FP32 2 + add 5 + FP16 2 + GELU 7
    assert unit.tree_latency == 9 and unit.latency == 1 + 9 + 6 + 17
    assert unit.contexts == 9 and unit.row_max_latency == 2
    # INT8 weights: the INT8 tile of 16 in place of the MAC tree, aligner 1 + 2 + 1 and lane 2 + 4; the column
    # scale's multiply (3) beside the bias's read register and widening (1 + 2) adds nothing
    assert unit.int8_tree_latency == 10 and unit.int8_latency == 1 + 10 + 6 + 17


def test_int8_latency_at_u280():
    """u280: the INT8 tile of 128 (aligner 1 + 4 + 1, lane 4 + 4) is 3 cycles deeper than the 64-wide MAC tree."""
    unit = MatrixUnit(get_config("u280"))
    assert (unit.tree_latency, unit.int8_tree_latency, unit.latency, unit.int8_latency) == (11, 14, 35, 38)


def test_rejects_mac_width_one():
    import dataclasses
    cfg = dataclasses.replace(small_config(abuf_words=2048, wbuf_words=1024), mac_width=1)
    with pytest.raises(ValueError, match="mac_width >= 2"):
        MatrixUnit(cfg)


@pytest.mark.rtl
def test_matrix_unit_bit_exact(run_tb, sim):
    run_tb(DESIGN, "ringgpt.sim.tb.tb_matrix", seed=3, instructions=INSTRUCTIONS[sim],
           issue_valid_probability=0.5, record=os.environ.get("RINGGPT_CYCLE_RECORD"))
