"""The RTL simulation as a server (a cocotb test, run by `RtlDevice` in a simulator process).

It builds a cocotbext-axi `AxiRam` for every AXI4 port of every core of `RingTop` (HBM pseudo-channels,
host buffer; an `AxiRamRead` for instruction fetch), connects to the RtlDevice's socket and serves its
commands until `quit`: `load` (programs, HBM segments placed through the ISA's channel map, host buffer
sizes), `load_programs` (every card's program replaced, the memories kept), `write_host` / `read_host`,
`run` (pos, rows, cycle limit: one start pulse to every core, then wait until all have halted, one has
stopped on an error, or the limit passed; answers each core's done, error code, error pc, pc and
counters; every PROGRESS_CYCLES cycles each core's pc in sim.log). With the testbench argument `pause`,
every RAM and ring link pauses at random (for tests).
"""
from __future__ import annotations

import itertools
import logging
import random

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, First, FallingEdge, RisingEdge
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiBus, AxiRam, AxiRamRead, AxiReadBus

from ringgpt.hw import hbm
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.isa import INSTRUCTION_BYTES
from ringgpt.sim.cocotb_support import bench

from . import process


PROGRESS_CYCLES = 10_000
"""A running `run` logs every core's pc to sim.log this often (a u280 core simulates tens of cycles a second)."""


def pauses(seed: int):
    """A repeating random pattern of pauses (30 % of cycles) for a cocotbext-axi channel."""
    rng = random.Random(seed)
    return itertools.cycle([rng.random() < 0.3 for _ in range(997)])


class RingBench:
    """The memories around RingTop's cores, and the commands of the RtlDevice protocol."""

    def __init__(self, dut):
        self.dut = dut
        self.top = bench.design()
        self.cfg = self.top.cfg
        self.cards = self.top.cards
        self.pause = bool(bench.args().get("pause"))
        self.seeds = itertools.count(1)
        # every memory exists from reset on (an undriven response channel would leave X in the core); each is
        # as large as one HBM channel, allocated lazily
        size = self.cfg.hbm_channel_mbytes << 20
        self.hbm = [[AxiRam(AxiBus.from_prefix(dut, f"c{card}_{hbm.hbm_port(c)}_"), dut.clk, dut.rst, size=size)
                     for c in range(self.cfg.hbm_channels)] for card in range(self.cards)]
        self.prog = [AxiRamRead(AxiReadBus.from_prefix(dut, f"c{card}_prog_"), dut.clk, dut.rst, size=size)
                     for card in range(self.cards)]
        self.host = [AxiRam(AxiBus.from_prefix(dut, f"c{card}_host_"), dut.clk, dut.rst, size=size)
                     for card in range(self.cards)]
        for ram in [*itertools.chain(*self.hbm), *self.prog, *self.host]:
            for side in (ram, getattr(ram, "write_if", None), getattr(ram, "read_if", None)):
                if hasattr(side, "log"):
                    side.log.setLevel(logging.WARNING)  # not a line per burst
            self._ram_pauses(ram)
        dut.start.value = 0
        dut.pos.value = 0
        dut.rows.value = 0

    def _ram_pauses(self, ram):
        if not self.pause:
            return
        for interface in [getattr(ram, "write_if", None), getattr(ram, "read_if", None)]:
            if interface is None:
                continue
            for name in ("aw", "w", "b", "ar", "r"):
                channel = getattr(interface, f"{name}_channel", None)
                if channel is not None:
                    channel.set_pause_generator(pauses(next(self.seeds)))

    async def start(self):
        await bench.start(self.dut)
        await FallingEdge(self.dut.clk)

    # --- commands ---------------------------------------------------------------------------------
    async def load(self, cards: list):
        for index, card in enumerate(cards):
            self.write_program(index, card["program"])
            for address, words in card["hbm"]:
                self.write_hbm(index, address, np.asarray(words, np.uint16))
        return None

    async def load_programs(self, programs: list):
        for index, words in enumerate(programs):
            self.write_program(index, words)
        return None

    def write_program(self, card: int, words: list):
        """The program's 512-bit words from pc 0 on (what lies beyond its HALT is never executed)."""
        self.prog[card].write(0, b"".join(int(word).to_bytes(INSTRUCTION_BYTES, "little") for word in words))

    def write_hbm(self, card: int, address: int, words: np.ndarray):
        """HBM words [address, address + size) through the ISA's map: one contiguous write per channel."""
        for channel, ram in enumerate(self.hbm[card]):
            lo, hi = hbm.local_range(channel, address, address + words.size, self.cfg)
            if lo < hi:
                ram.write(2 * lo, words[hbm.hbm_word(channel, np.arange(lo, hi), self.cfg) - address].tobytes())

    async def write_host(self, card: int, offset: int, words):
        self.host[card].write(2 * offset, np.asarray(words, np.uint16).tobytes())

    async def read_host(self, card: int, offset: int, count: int):
        return np.frombuffer(self.host[card].read(2 * offset, 2 * count), np.uint16).copy()

    async def run(self, pos: int, rows: int, limit: int):
        dut = self.dut
        await FallingEdge(dut.clk)
        dut.pos.value, dut.rows.value, dut.start.value = pos, rows, 1
        await FallingEdge(dut.clk)
        dut.start.value = 0
        waited = 0
        while not dut.finished.value and waited < limit:
            step = min(PROGRESS_CYCLES, limit - waited)
            await First(RisingEdge(dut.finished), ClockCycles(dut.clk, step))
            waited += step
            if not dut.finished.value:
                pcs = ", ".join(str(int(getattr(dut, f"c{card}_pc").value)) for card in range(self.cards))
                dut._log.info("run at pos %d: %d cycles, pc %s", pos, waited, pcs)
        await FallingEdge(dut.clk)
        cards = []
        for card in range(self.cards):
            sig = lambda name: int(getattr(dut, f"c{card}_{name}").value)
            cards.append({"card": card, "done": bool(sig("done")), "error": ErrorCode(sig("error")).name,
                          "error_pc": sig("error_pc"), "pc": sig("pc"), "cycles": sig("cycles"),
                          "busy": {unit: sig(f"busy_{unit}") for unit in self.top.busy_units}})
        return {"halted": all(c["done"] for c in cards), "cycles": max(c["cycles"] for c in cards),
                "cards": cards}


@cocotb.test()
async def serve(dut):
    """Serves the RtlDevice until it says quit."""
    tb = RingBench(dut)
    await tb.start()
    await process.serve({"load": tb.load, "load_programs": tb.load_programs, "write_host": tb.write_host,
                         "read_host": tb.read_host, "run": tb.run},
                        lambda: int(get_sim_time(unit="ns")) // bench.CLOCK_PERIOD_NS)
