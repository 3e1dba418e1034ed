"""The router (hw/core/router.py) against the functional simulator's ring, on Verilator and Icarus: one router
with cocotbext-axi neighbours, and rings of 1 to 3 routers in one simulation (sim/cocotb_support/ring.py)."""
import pytest

from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.core.router import HEADER, link_block
from ringgpt.hw.core.timing import RouterTiming
from ringgpt.hw.isa import Opcode
from ringgpt.sim.cocotb_support.runner import Design

DESIGN = Design.of("ringgpt.hw.core.datapath:Datapath", unit="router", wbuf_words=64)
RING = Design.of("ringgpt.sim.cocotb_support.ring:RouterRing", cards=3, wbuf_words=64)
CASES = {"verilator": 60, "icarus": 24}
GATHERS = {"verilator": 4, "icarus": 2}


def test_link_block_and_cycles():
    unit = RouterTiming(small_config(abuf_words=2048, wbuf_words=1024))
    P = unit.width
    words = [[row * 100 + j for j in range(P + 2)] for row in range(2)]
    beats = link_block(Opcode.SEND, 1, 2, P + 2, 0, words, P)
    header = HEADER.const({"kind": Opcode.SEND, "origin": 1, "rows": 2, "n": P + 2, "k": 0}).as_value().value
    assert beats[0] == (header, 0) and [last for _, last in beats] == [0, 0, 0, 0, 1]
    assert beats[2][0] == P | (P + 1) << 16       # row 0's words P and P + 1, the lanes past n zero
    empty = HEADER.const({"kind": Opcode.ALLGATHER, "origin": 0, "rows": 3, "n": 0, "k": 5}).as_value().value
    assert link_block(Opcode.ALLGATHER, 0, 3, 0, 5, [[]] * 3, P) == [(empty, 1)]
    assert (unit.overhead, unit.latency, unit.rx_latency) == (4, 2, 3)
    assert unit.cycles(Opcode.SEND, 3, 2 * P + 1) == 4 + 2 + 9 + 2
    assert unit.cycles(Opcode.RECV, 3, 2 * P + 1) == 4 + 1 + 9
    assert unit.cycles(Opcode.RECV, 0, 4) == unit.overhead
    assert unit.cycles(Opcode.ALLGATHER, 2, P, slices=((P, 0),), in_place=False) == 4 + 1 + 2 + 1
    # 2 beats a slice: the own block leaves by cycle 9, the other card's is written in cycle 10; a third card
    # adds a store-and-forward step of 6 + 2 cycles
    assert unit.cycles(Opcode.ALLGATHER, 2, P, slices=((P, 0), (P, P))) == 12
    assert unit.cycles(Opcode.ALLGATHER, 2, P, slices=((P, 0), (P, P), (P, 2 * P))) == 20


@pytest.mark.rtl
def test_router_bit_exact(run_tb, sim):
    run_tb(DESIGN, "ringgpt.sim.tb.tb_router", seed=3, cases=CASES[sim], issue_valid_probability=0.5, link_pause=0.3)


@pytest.mark.rtl
def test_router_ring_bit_exact(run_tb, sim):
    run_tb(RING, "ringgpt.sim.tb.tb_router", seed=4, gathers=GATHERS[sim], issue_valid_probability=0.5,
           link_pause=0.3)
