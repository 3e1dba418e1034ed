"""Testbench of the Vitis kernel (hw/kernel/kernel.py) on one card, as the host sees it.

`KernelBench` is the simulated top: KernelTop's ports around one instance of module `ringgpt_kernel`, whose
Verilog (KernelTop.verilog) the runner appends. The host is a cocotbext-axi `AxiLiteMaster` on `s_axi_control`;
every `m_axi` port is answered by an `AxiRam` (`AxiRamRead` for a read-only port) pausing at random, all over
one sparse 64-bit address space as on the card, so the base addresses written to the arguments must keep the
buffers apart; the ring is idle (one card). Tests:
- `registers`: every readable word against `RegisterGolden` (written from registers.py) through argument writes
  (partial strobes included), writes to status words, runs (ap_start, running, ap_done and ap_ready cleared by
  the read that returns them, ap_idle), ISR toggle-on-write and `interrupt` under GIE and IER;
- `program`: the program, HBM channel images and host buffer of `args["case"]` (an .npz the test wrote, with the
  functional simulator's host buffer after the run) placed above 4 GiB, arguments written, started, the
  interrupt awaited: the host buffer is the simulator's bit for bit, the status words say it halted;
- `illegal`: an illegal word stops the run with ILLEGAL at its pc.
"""
from __future__ import annotations

import itertools
import logging
import random

import cocotb
import numpy as np
from amaranth.hdl import Module
from amaranth.lib import wiring
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, First, RisingEdge
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam, AxiRamRead, AxiReadBus
from cocotbext.axi.sparse_memory import SparseMemory

from ringgpt.hw import hbm
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.isa import INSTRUCTION_BITS, INSTRUCTION_BYTES, Instruction, Opcode
from ringgpt.hw.kernel.kernel import KernelTop
from ringgpt.hw.kernel.registers import (AP_DONE, AP_IDLE, AP_READY, AP_START, CONTROL, DATA_BITS, GIE, IER,
                                         IRQ_DONE, IRQ_READY, ISR, by_name, master_ports, register_map)
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.rtl.server import pauses
from ringgpt.sim.rtl.top import config_of

IRQ_MASK = IRQ_DONE | IRQ_READY
WORD_BYTES = DATA_BITS // 8
CYCLE_LIMIT = 10_000
"""Cycles a run may take (the longest here, the compiled program, takes about 1,700)."""
HIGH = 1 << 32
MEMORY_BYTES = 1 << 48
"""The simulated address space (sparse; Python's len() of a memory stops short of 2**64)."""
"""Every buffer lies above 4 GiB, so the arguments' high words matter."""


class KernelBench(wiring.Component):
    """`ringgpt_kernel` for `config` (a preset name or an ArchConfig as JSON) as an instance in a top with the
    same ports."""

    def __init__(self, config: str):
        self.cfg = config_of(config)
        super().__init__(KernelTop.signature_of(self.cfg))

    def verilog_modules(self) -> str:
        return KernelTop.verilog(self.cfg)

    def elaborate(self, platform):
        m = Module()
        m.submodules.kernel = KernelTop.instance(self)
        return m


class KernelTB:
    """Clock, reset, the host's AXI4-Lite master and the memories behind the m_axi ports."""

    def __init__(self, dut):
        self.dut = dut
        self.cfg = bench.design().cfg
        self.memory = SparseMemory(MEMORY_BYTES)
        members = bench.design().signature.members
        clock, reset = dut.ap_clk, dut.ap_rst_n
        self.host = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi_control"), clock, reset, reset_active_level=False)
        seeds = itertools.count(1)
        for port in master_ports(self.cfg):
            prefix = f"m_axi_{port}"
            if f"{prefix}_awvalid" in members:
                ram = AxiRam(AxiBus.from_prefix(dut, prefix), clock, reset, reset_active_level=False, mem=self.memory)
                interfaces = (ram.write_if, ram.read_if)
            else:
                ram = AxiRamRead(AxiReadBus.from_prefix(dut, prefix), clock, reset, reset_active_level=False,
                                 mem=self.memory)
                interfaces = (ram,)
            for interface in interfaces:
                interface.log.setLevel(logging.WARNING)  # not a line per burst
                for name in ("aw", "w", "b", "ar", "r"):
                    channel = getattr(interface, f"{name}_channel", None)
                    if channel is not None:
                        channel.set_pause_generator(pauses(next(seeds)))
        self.host.write_if.log.setLevel(logging.WARNING)
        self.host.read_if.log.setLevel(logging.WARNING)
        dut.ring_rx_tvalid.value = 0
        dut.ring_rx_tdata.value = 0
        dut.ring_rx_tlast.value = 0
        dut.ring_tx_tready.value = 0

    async def reset(self):
        Clock(self.dut.ap_clk, bench.CLOCK_PERIOD_NS, unit="ns").start()
        self.dut.ap_rst_n.value = 0
        await ClockCycles(self.dut.ap_clk, 4)
        self.dut.ap_rst_n.value = 1
        await ClockCycles(self.dut.ap_clk, 2)

    async def read(self, offset: int) -> int:
        return await self.host.read_dword(offset)

    async def write(self, offset: int, value: int):
        await self.host.write_dword(offset, value)

    def argument_words(self, name: str, value: int) -> list:
        """(offset, word) of each word of argument `name` holding `value`, low word first."""
        register = by_name(self.cfg)[name]
        return [(register.offset + WORD_BYTES * w, (value >> (DATA_BITS * w)) % (1 << DATA_BITS))
                for w in range(register.bits // DATA_BITS)]

    async def write_argument(self, name: str, value: int):
        for offset, word in self.argument_words(name, value):
            await self.write(offset, word)

    async def status(self) -> dict:
        return {r.name: await self.read(r.offset) for r in register_map(self.cfg) if r.kind == "status"}

    def place_program(self, base: int, words: list):
        self.memory.write(base, b"".join(int(word).to_bytes(INSTRUCTION_BYTES, "little") for word in words))

    def place_hbm(self, bases: list, address: int, words: np.ndarray):
        """HBM words [address, address + size) through the ISA's channel map, channel c's local word w at
        bases[c] + 2w."""
        for channel, base in enumerate(bases):
            lo, hi = hbm.local_range(channel, address, address + words.size, self.cfg)
            if lo < hi:
                local = words[hbm.hbm_word(channel, np.arange(lo, hi), self.cfg) - address]
                self.memory.write(base + 2 * lo, local.tobytes())

    async def run(self, pos: int, rows: int, program: int, host: int, hbm_bases: list) -> dict:
        """Writes the arguments, starts with the done interrupt enabled, waits for it (or CYCLE_LIMIT cycles);
        returns the status words and the control word read once it is done."""
        arguments = {"pos": pos, "rows": rows, "card_id": 0, "cards": 1, "program": program, "host": host,
                     **{port: base for port, base in zip(master_ports(self.cfg)[1:-1], hbm_bases)}}
        for name, value in arguments.items():
            await self.write_argument(name, value)
        await self.write(GIE, 1)
        await self.write(IER, IRQ_DONE)
        await self.write(CONTROL, AP_START)
        await First(RisingEdge(self.dut.interrupt), ClockCycles(self.dut.ap_clk, CYCLE_LIMIT))
        assert self.dut.interrupt.value == 1, f"no interrupt within {CYCLE_LIMIT} cycles"
        result = {"control": await self.read(CONTROL), "isr": await self.read(ISR), **(await self.status())}
        await self.write(ISR, IRQ_DONE)
        assert self.dut.interrupt.value == 0, "the interrupt stayed up after its ISR bit was cleared"
        return result


class RegisterGolden:
    """What the host reads from each word of the map while the kernel is idle, from registers.py alone: the
    arguments hold what was written (by byte strobes; a scalar's high word reads 0), GIE, IER and ISR their
    bits, control AP_IDLE plus AP_DONE and AP_READY until read; status and unmapped words ignore writes."""

    def __init__(self, cfg):
        self.words = {}
        for register in register_map(cfg):
            if register.kind != "status":
                self.words.update({register.offset + WORD_BYTES * w: 0 for w in range(register.bits // DATA_BITS)})
        self.done = self.gie = self.ier = self.isr = 0

    def write(self, offset: int, data: bytes):
        """A write of `data` at byte `offset` (within one word): the bytes it covers are strobed."""
        word, first = offset & ~(WORD_BYTES - 1), offset % WORD_BYTES
        value = int.from_bytes(data, "little") << (8 * first)
        mask = ((1 << (8 * len(data))) - 1) << (8 * first)
        if word in self.words:
            self.words[word] = (self.words[word] & ~mask) | (value & mask)
        elif mask & 0xFF:  # the control bits all lie in byte 0
            if word == GIE:
                self.gie = value & 1
            elif word == IER:
                self.ier = value & IRQ_MASK
            elif word == ISR:
                self.isr ^= value & IRQ_MASK

    def finish(self):
        """A run ended: ap_done and ap_ready rise, and the ISR bits IER enables."""
        self.done = AP_DONE | AP_READY
        self.isr |= self.ier & IRQ_MASK

    def read(self, offset: int) -> int:
        if offset == CONTROL:
            value, self.done = AP_IDLE | self.done, 0
            return value
        return {GIE: self.gie, IER: self.ier, ISR: self.isr}.get(offset, self.words.get(offset, 0))

    @property
    def interrupt(self) -> int:
        return int(bool(self.gie and self.ier & self.isr))


async def check_all(tb: KernelTB, golden: RegisterGolden, words: list, what: str):
    for offset in words:
        got, expected = await tb.read(offset), golden.read(offset)
        assert got == expected, f"{what}: word {offset:#05x} reads {got:#010x}, expected {expected:#010x}"
    assert tb.dut.interrupt.value == golden.interrupt, f"{what}: interrupt is {tb.dut.interrupt.value}"


async def run_to_done(tb: KernelTB, golden: RegisterGolden) -> int:
    """Starts the program at the current arguments; polls control until it reads AP_DONE, checking that it
    reads busy (not idle, not done) until then; returns how many polls saw it busy."""
    await tb.write(CONTROL, AP_START)
    busy = 0
    while True:
        control = await tb.read(CONTROL)
        if control & AP_DONE:
            break
        assert control & ~AP_START == 0, f"control reads {control:#x} while running"
        busy += 1
        assert busy < CYCLE_LIMIT // 4, "the run did not finish"
    assert control == AP_DONE | AP_READY | AP_IDLE, f"control reads {control:#x} when done"
    golden.finish()
    golden.done = 0  # that read took them
    return busy


@cocotb.test()
async def registers(dut):
    """Register semantics against RegisterGolden."""
    tb = KernelTB(dut)
    await tb.reset()
    cfg, rng = tb.cfg, random.Random(12)
    golden = RegisterGolden(cfg)
    status = [r.offset for r in register_map(cfg) if r.kind == "status"]
    # every word but the status words, and two unmapped words past the map
    every_word = [offset for offset in range(0, status[-1] + 3 * WORD_BYTES, WORD_BYTES) if offset not in status]
    await check_all(tb, golden, every_word + status, "after reset")  # status words read 0 before any run

    for offset in every_word:  # every word written, unmapped ones included
        if offset in (CONTROL, ISR, GIE, IER):
            continue
        data = rng.getrandbits(DATA_BITS).to_bytes(WORD_BYTES, "little")
        await tb.host.write(offset, data)
        golden.write(offset, data)
    for offset in rng.sample(sorted(golden.words), 6):  # partial strobes
        start = rng.randrange(WORD_BYTES)
        data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, WORD_BYTES - start + 1)))
        await tb.host.write(offset + start, data)
        golden.write(offset + start, data)
    await check_all(tb, golden, every_word, "after argument writes")

    # a program of NOPs long enough to be seen running, at a base above 4 GiB
    base = HIGH * 3 + 0x4000
    tb.place_program(base, [Instruction.make(Opcode.NOP).encode()] * 60 + [Instruction.make(Opcode.HALT).encode()])
    for name, value in (("program", base), ("card_id", 0), ("cards", 1)):
        for offset, word in tb.argument_words(name, value):
            await tb.write(offset, word)
            golden.write(offset, word.to_bytes(WORD_BYTES, "little"))

    for ier, gie in ((IRQ_MASK, 0), (0, 1), (IRQ_DONE, 1), (IRQ_READY, 1)):
        for offset, value in ((IER, ier), (GIE, gie)):
            await tb.write(offset, value)
            golden.write(offset, value.to_bytes(WORD_BYTES, "little"))
        busy = await run_to_done(tb, golden)
        assert busy > 0, "the run was never seen running"
        await check_all(tb, golden, every_word, f"after a run with IER {ier}, GIE {gie}")
        status_words = await tb.status()
        assert status_words["error"] == ErrorCode.NONE.value and status_words["pc"] == 60, status_words
        assert status_words["cycles"] > 60, status_words
        for offset in status:  # read-only
            await tb.write(offset, rng.getrandbits(DATA_BITS))
        assert await tb.status() == status_words, "a status word changed when written"
        # ISR: toggle on write, every pattern; GIE and IER gate the interrupt
        for value in (IRQ_DONE, IRQ_READY, IRQ_MASK, 0, IRQ_DONE, IRQ_MASK):
            await tb.write(ISR, value)
            golden.write(ISR, value.to_bytes(WORD_BYTES, "little"))
            await check_all(tb, golden, [ISR, IER, GIE, CONTROL], f"ISR written {value}")
        for offset, value in ((IER, IRQ_MASK), (GIE, 1), (IER, 0), (GIE, 0), (ISR, golden.isr)):
            await tb.write(offset, value)
            golden.write(offset, value.to_bytes(WORD_BYTES, "little"))
            await check_all(tb, golden, [ISR, IER, GIE], f"{offset:#x} written {value}")
    await check_all(tb, golden, every_word, "at the end")


@cocotb.test()
async def program(dut):
    """A compiled program on HBM images and a host buffer above 4 GiB gives the functional simulator's buffer."""
    tb = KernelTB(dut)
    await tb.reset()
    case = np.load(bench.args()["case"])
    channels = tb.cfg.hbm_channels
    # distinct bases: program, channels, host, each in its own 4 GiB page and not at its start
    bases = [HIGH * (index + 1) + 0x1000 * (index + 3) for index in range(channels + 2)]
    program_base, hbm_bases, host_base = bases[0], bases[1:-1], bases[-1]
    tb.place_program(program_base, [int.from_bytes(word.tobytes(), "little") for word in case["program"]])
    for address, start, count in case["segments"]:
        tb.place_hbm(hbm_bases, int(address), case["hbm"][start:start + count])
    tb.memory.write(host_base, case["host_before"].tobytes())
    result = await tb.run(int(case["pos"]), int(case["rows"]), program_base, host_base, hbm_bases)
    assert result["control"] == AP_DONE | AP_READY | AP_IDLE and result["isr"] == IRQ_DONE, result
    halted = (ErrorCode.NONE.value, 0, int(case["halt_pc"]))
    assert (result["error"], result["error_pc"], result["pc"]) == halted, result
    assert result["cycles"] > 0, result
    expected = case["host_after"]
    got = np.frombuffer(tb.memory.read(host_base, expected.nbytes), np.uint16)
    logits = slice(int(case["logits_offset"]), int(case["logits_offset"]) + int(case["logits_count"]))
    np.testing.assert_array_equal(got[logits], expected[logits], "logits differ from the functional simulator's")
    np.testing.assert_array_equal(got, expected, "the host buffer differs from the functional simulator's")


@cocotb.test()
async def illegal(dut):
    """An illegal word ends the run with ap_done, error ILLEGAL and error_pc at that word."""
    tb = KernelTB(dut)
    await tb.reset()
    word = Instruction.make(Opcode.NOP).encode() | (1 << (INSTRUCTION_BITS - 1))  # a reserved bit set
    words = [Instruction.make(Opcode.NOP).encode()] * 3 + [word] + [Instruction.make(Opcode.HALT).encode()]
    base = HIGH * 5 + 0x40
    tb.place_program(base, words)
    result = await tb.run(0, 1, base, HIGH * 6, [HIGH * 7] * tb.cfg.hbm_channels)
    assert result["control"] == AP_DONE | AP_READY | AP_IDLE, result
    assert (result["error"], result["error_pc"]) == (ErrorCode.ILLEGAL.value, 3), result
