"""The controller, fetch and scoreboard (hw/core/controller.py, fetch.py, scoreboard.py) with mock units and
the program in an AXI4 memory under random pauses, on Verilator and Icarus: issue order and registers against
the Python golden, no overlap of conflicting instructions, barriers, errors (sim/tb/tb_controller.py)."""
import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.core.axi import AXI_MAX_BURST
from ringgpt.hw.core.controller import Controller
from ringgpt.hw.core.fetch import Fetch
from ringgpt.hw.isa import EXECUTING_UNITS, Unit
from ringgpt.sim.cocotb_support.runner import Design

DESIGN = Design.of("ringgpt.sim.tb.tb_controller:ControlHarness", queue_depth=2)
PROGRAMS = {"verilator": 40, "icarus": 12}


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
