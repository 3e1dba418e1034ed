"""RtlDevice: the RTL of every card's core, simulated in one process, behind the Device interface.

The simulation (`RingTop`: one `hw.core.core.Core` per card, ring links closed, every AXI4 port answered
by a cocotbext-axi `AxiRam`) runs as a cocotb test in a simulator process (`sim/rtl/server.py`) that
serves commands over a local socket: load the image's programs and HBM contents into the memories,
replace the programs (layer dispatch), write and read host buffers, run every core from a token position
until all halt. The process is built once per (design, simulator) in `sim_build/` and kept alive between
runs, so ABUF and WBUF persist from run to run as on a board. Errors come back as the DeviceError subclasses
that every back end raises (host/device.py: core_fault), naming the card, the pc and the instruction.
"""
from __future__ import annotations

import json
import time

import numpy as np

from ringgpt.host.device import (Device, DeviceStatus, HostAccessError, RingDeadlockError, RunStats, as_words,
                                 check_card, check_host_range, check_loaded, check_run, checked_cards, checked_programs,
                                 core_fault)
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.assembly import format_instruction
from ringgpt.sim.cocotb_support import runner

from .process import RtlError, SimulationProcess

DEFAULT_CYCLE_LIMIT = 1 << 24
"""Cycles one run may take before the simulation stops it and reports where each core stands."""


def design_of(config: ArchConfig, pause_links: bool = False) -> runner.Design:
    """The simulated top for `config`: one core per card on a ring (ring links pausing at random)."""
    return runner.Design.of("ringgpt.sim.rtl.top:RingTop", config=json.dumps(config.to_dict(), sort_keys=True),
                            pause_links=pause_links).with_cxx_opt(runner.LARGE_DESIGN_CXX_OPT)


class RtlDevice(Device):
    """`config.cards` RTL cores on a ring in one simulation (`simulator`: verilator or icarus)."""

    def __init__(self, config: ArchConfig, simulator: str = "verilator", cycle_limit: int = DEFAULT_CYCLE_LIMIT,
                 pause: bool = False):
        """`pause`: the AxiRams and ring links take random pauses (for tests; slower)."""
        reason = runner.missing_reason(simulator)
        if reason:
            raise RtlError(f"the rtl backend needs {simulator}: {reason}")
        self.config, self.simulator, self.cycle_limit, self.pause = config, simulator, cycle_limit, pause
        self._process: SimulationProcess | None = None
        self._programs: list = []
        self._host_words: list = []
        self._runs = 0
        self._last_error: str | None = None
        self.last_counters: list = []
        """Per card, the last run's counters from the core (cycles, busy cycles per unit)."""

    # --- the simulator process ----------------------------------------------------------------------
    def _start(self) -> None:
        self.close()
        self._process = SimulationProcess(design_of(self.config, self.pause), "ringgpt.sim.rtl.server", self.simulator,
                                          {"pause": self.pause}, "rtl-device", "the rtl backend")

    def _call(self, *command):
        check_loaded(self._process is not None)
        return self._process.call(*command)

    # --- Device ---------------------------------------------------------------------------------------
    def load(self, image) -> None:
        """Checks the image as every back end does, (re)starts the simulation and fills the cores' memories."""
        cards = checked_cards(image, self.config)
        self._start()
        self._programs = [card.program for card in cards]
        self._host_words = [card.host_words for card in cards]
        self._call("load", [{"program": [d.inst.encode() for d in card.program],
                             "hbm": [(address, words.view(np.uint16)) for address, words in card.hbm_segments],
                             "hbm_words": card.hbm_words, "host_words": card.host_words} for card in cards])

    supports_load_programs = True

    def load_programs(self, programs) -> None:
        """Writes every card's new program (checked as load checks them) over the old one in its program memory;
        HBM, ABUF, WBUF and the host buffers stay as they are."""
        check_loaded(bool(self._programs))
        decoded = checked_programs(programs, self.config)
        self._call("load_programs", [[d.inst.encode() for d in program] for program in decoded])
        self._programs = decoded

    def _host_range(self, card: int, offset: int, count: int) -> None:
        check_card(card, len(self._programs))
        check_host_range(card, offset, count, self._host_words[card])

    def write_host(self, card: int, offset: int, words) -> None:
        words = as_words(words, HostAccessError, "host buffer words")
        self._host_range(card, offset, words.size)
        self._call("write_host", int(card), int(offset), words.view(np.uint16).copy())

    def read_host(self, card: int, offset: int, count: int) -> np.ndarray:
        self._host_range(card, offset, count)
        return np.asarray(self._call("read_host", int(card), int(offset), int(count)), np.uint16).view(np.float16)

    def run(self, pos: int, rows: int) -> RunStats:
        """Runs every core with R1 = pos, R2 = rows until all halt; RunStats.cycles is the RTL's own count."""
        check_run(pos, rows)
        started = time.perf_counter()
        result = self._call("run", int(pos), int(rows), self.cycle_limit)
        self.last_counters = result["cards"]
        stopped = [c for c in result["cards"] if c["error"] != "NONE"]
        if stopped:
            first = stopped[0]
            exc = core_fault(first["card"], first["error_pc"], first["error"], self._programs[first["card"]],
                             result["cycles"])
            self._last_error = str(exc)
            raise exc
        if not result["halted"]:
            states = [(c["card"], c["pc"], self._describe(c["card"], c["pc"]),
                       "halted" if c["done"] else "still running") for c in result["cards"]]
            exc = RingDeadlockError(f"the cores did not all halt within {self.cycle_limit} cycles", states)
            self._last_error = str(exc)
            raise exc
        self._runs += 1
        self._last_error = None
        cfg = self.config
        cycles = result["cycles"]
        return RunStats(cycles=cycles, seconds=cycles / (cfg.clock_mhz * 1e6) + cfg.launch_overhead_us * 1e-6,
                        breakdown=dict(max(result["cards"], key=lambda c: c["cycles"])["busy"]),
                        wall_seconds=time.perf_counter() - started)

    def _describe(self, card: int, pc: int) -> str:
        program = self._programs[card]
        return format_instruction(program[pc].inst) if 0 <= pc < len(program) else "past the last instruction"

    def status(self) -> DeviceStatus:
        return DeviceStatus(f"RTL simulation ({self.simulator})", self.config.name, self.config.cards,
                            bool(self._programs), self._runs, self._last_error)

    def close(self) -> None:
        if self._process is not None:
            self._process.close()
            self._process = None
        self._programs = []
