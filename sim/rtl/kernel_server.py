"""The kernels' RTL as a server of the platform protocol (a cocotb test, run by SimKernelPlatform in a simulator
process).

Around `KernelRing` it builds, per card, a cocotbext-axi `AxiLiteMaster` on `s_axi_control` and one memory per
`m_axi` port (an `AxiRam`; an `AxiRamRead` for the read-only `prog`), each as large as one bank
(`bank_bytes`): the platform places bank p of a card at MEMORY_BASE + p * bank_bytes, a multiple of the bank's
size, so the RAM's own `address % size` turns a kernel's 64-bit address into the offset in its bank. It
connects to the platform's socket and serves its commands until `quit`: `read` / `write` (one 32-bit register
of a card, through its AXI4-Lite master), `store` / `fetch` (bytes of one port's memory at an offset in its bank,
in zero simulated time, as the host's DMA to the card's memory), `sleep` (let the clock run a number of cycles).
Every answer carries the clock cycles simulated so far. With the testbench argument `pause`, every memory and
ring link pauses at random (for tests).
"""
from __future__ import annotations

import itertools
import logging

import cocotb
from cocotb.triggers import ClockCycles
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam, AxiRamRead, AxiReadBus

from ringgpt.hw.kernel.registers import master_ports
from ringgpt.sim.cocotb_support import bench

from . import process
from .server import pauses

KERNEL_RESET_CYCLES = 4
"""Cycles `rst` is held, and waited after: the kernels see it two cycles late (KernelRing registers ap_rst_n, the
kernel registers it again)."""


class KernelBench:
    """The AXI4-Lite masters and memories around KernelRing's kernels, and the commands of the platform."""

    def __init__(self, dut):
        self.dut = dut
        top = bench.design()
        self.cfg, self.cards = top.cfg, top.cards
        args = bench.args()
        self.pause, bank_bytes = bool(args.get("pause")), int(args["bank_bytes"])
        seeds = itertools.count(1)
        self.control = [AxiLiteMaster(AxiLiteBus.from_prefix(dut, f"c{card}_s_axi_control"), dut.clk, dut.rst)
                        for card in range(self.cards)]
        self.memory = [{port: (AxiRamRead(AxiReadBus.from_prefix(dut, f"c{card}_m_axi_{port}"), dut.clk, dut.rst,
                                          size=bank_bytes) if port == "prog" else
                               AxiRam(AxiBus.from_prefix(dut, f"c{card}_m_axi_{port}"), dut.clk, dut.rst,
                                      size=bank_bytes))
                        for port in master_ports(self.cfg)} for card in range(self.cards)]
        for part in [*self.control, *(ram for card in self.memory for ram in card.values())]:
            for side in (part, getattr(part, "write_if", None), getattr(part, "read_if", None)):
                if hasattr(side, "log"):
                    side.log.setLevel(logging.WARNING)  # not a line per transfer
        if self.pause:
            for ram in (ram for card in self.memory for ram in card.values()):
                for interface in (getattr(ram, "write_if", None), getattr(ram, "read_if", None)):
                    for name in ("aw", "w", "b", "ar", "r"):
                        channel = getattr(interface, f"{name}_channel", None)
                        if channel is not None:
                            channel.set_pause_generator(pauses(next(seeds)))

    def cycles(self) -> int:
        return int(get_sim_time(unit="ns")) // bench.CLOCK_PERIOD_NS

    # --- commands ---------------------------------------------------------------------------------
    async def read(self, card: int, offset: int) -> int:
        return await self.control[card].read_dword(offset)

    async def write(self, card: int, offset: int, value: int) -> None:
        await self.control[card].write_dword(offset, value)

    async def store(self, card: int, port: str, offset: int, data: bytes) -> None:
        self.memory[card][port].write(offset, data)

    async def fetch(self, card: int, port: str, offset: int, nbytes: int) -> bytes:
        return self.memory[card][port].read(offset, nbytes)

    async def sleep(self, cycles: int) -> None:
        await ClockCycles(self.dut.clk, cycles)


@cocotb.test()
async def serve(dut):
    """Serves SimKernelPlatform until it says quit."""
    tb = KernelBench(dut)
    await bench.start(dut, reset_cycles=KERNEL_RESET_CYCLES)
    await ClockCycles(dut.clk, KERNEL_RESET_CYCLES)
    await process.serve({"read": tb.read, "write": tb.write, "store": tb.store, "fetch": tb.fetch,
                         "sleep": tb.sleep}, tb.cycles)
