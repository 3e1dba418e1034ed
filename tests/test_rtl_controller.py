"""The controller, fetch and scoreboard (hw/core/controller.py, fetch.py, scoreboard.py) with mock units and
the program in an AXI4 memory under random pauses, on Verilator and Icarus: issue order and registers against
the Python golden, no overlap of conflicting instructions, barriers, errors (sim/tb/tb_controller.py)."""
import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from ringgpt.hw.config import get_config
from ringgpt.hw.core.axi import AXI_MAX_BURST
from ringgpt.hw.core.controller import Controller, earliest_error
from ringgpt.hw.core.fetch import PC_BITS
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.core.fetch import Fetch
from ringgpt.hw.isa import EXECUTING_UNITS, Unit
from ringgpt.sim.cocotb_support.runner import Design

DESIGN = Design.of("ringgpt.sim.tb.tb_controller:ControlHarness", queue_depth=2)
PROGRAMS = {"verilator": 40, "icarus": 12}


@pytest.mark.parametrize("count", [1, 2, 5, 6])
def test_earliest_error_takes_the_lowest_pc_first_listed_on_ties(count):
    """The controller's error choice (earliest_error, a tree) against the chain it replaced, in Amaranth: random
    presence, codes and pcs from a small range (so that ties happen)."""
    m = Module()
    present = [Signal(name=f"any{i}") for i in range(count)]
    codes = [Signal(ErrorCode, name=f"code{i}") for i in range(count)]
    pcs = [Signal(PC_BITS, name=f"pc{i}") for i in range(count)]
    found, code, pc = earliest_error(m, list(zip(present, codes, pcs)))
    rng = random.Random(count)
    wrong = []

    async def bench(ctx):
        for _ in range(400):
            case = [(rng.random() < 0.6, rng.choice(list(ErrorCode)[1:]), rng.randrange(4)) for _ in range(count)]
            for (a, c, p), signals in zip(case, zip(present, codes, pcs)):
                for signal, value in zip(signals, (a, c, p)):
                    ctx.set(signal, value)
            best = None
            for a, c, p in case:                        # the chain: a later one only with a strictly lower pc
                if a and (best is None or p < best[1]):
                    best = (c, p)
            got = (ctx.get(found), ctx.get(code), ctx.get(pc))
            if best is not None and got != (1, best[0], best[1]) or best is None and got[0] != 0:
                wrong.append((case, got))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert wrong == [], wrong[:2]


def test_ports_and_sizes():
    cfg = get_config("sim-small")
    controller, fetch, u280 = Controller(cfg), Fetch(cfg), Fetch(get_config("u280"))
    for component in (controller, fetch, u280):
        component._MustUse__silence = True
    assert EXECUTING_UNITS == (Unit.DMA, Unit.MATRIX, Unit.VECTOR, Unit.ROUTER)
    for unit in ("dma", "matrix", "vector", "router"):
        assert {f"issue_{unit}", f"status_{unit}", f"busy_{unit}"} <= set(controller.signature.members)
    assert controller.signature.members["fetch"].signature.flip() == fetch.signature.members["control"].signature
    assert fetch.beats_per_word == 4 and fetch.depth >= cfg.hbm_latency_cycles
    assert fetch.burst_words * fetch.beats_per_word <= AXI_MAX_BURST
    assert u280.beats_per_word == 1 and u280.depth >= get_config("u280").hbm_latency_cycles


@pytest.mark.rtl
def test_controller_random_programs(run_tb, sim):
    run_tb(DESIGN, "ringgpt.sim.tb.tb_controller", seed=21, programs=PROGRAMS[sim])
