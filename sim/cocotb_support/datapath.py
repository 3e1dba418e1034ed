"""The single-instruction bench (inside the simulator): drives `hw.core.datapath.Datapath`.

`DatapathTB` owns the clock, reset, the load and dump ports and the issue stream: `sync` writes the
words of ABUF and WBUF that differ from what the design holds, `execute` issues one instruction word
with a register file and waits for `done` (failing after a bound: a unit must never hang), `dump`
reads both buffers back whole. The issue stream is driven by `bench.StreamSource` with random gaps:
valid is raised with probability `issue_probability` per cycle (the testbench argument
`issue_valid_probability`, default 1.0: full rate), and while valid is low the payload carries random
garbage, which the unit must ignore. `golden` runs the same instruction on the functional simulator from the
same state; `check_instruction` does all of it and compares every word of both buffers.

Every value is driven at a falling edge and sampled at the next falling edge.
"""
from __future__ import annotations

import json
import random

import cocotb
import numpy as np
from cocotb.triggers import FallingEdge, ReadOnly

from ringgpt.hw import numerics as nx
from ringgpt.hw.core.interfaces import ErrorCode, IssueLayout
from ringgpt.hw.isa import NUM_REGS, Instruction, Space
from ringgpt.hw.resolved import Decoded
from ringgpt.sim.cycle_model import instruction_cost
from ringgpt.sim.functional.machine import Card

from . import bench

SPACES = (Space.ABUF, Space.WBUF)


def golden(cfg, state: dict, inst: Instruction, regs) -> dict:
    """The buffers after the functional simulator executes `inst` from `state` ({Space: uint16 array})."""
    card = Card(0, cfg, [Decoded(inst)], 0, 0)
    for space in SPACES:
        card.mem[space][:] = nx.fp16_from_bits(state[space])
    card.regs = list(regs)
    resolved = card.program[0].resolve(card.regs, 0)
    card._execute[inst.opcode](resolved)
    return {space: nx.fp16_bits(card.mem[space]).copy() for space in SPACES}


def resolved_of(inst: Instruction, regs):
    return Decoded(inst).resolve(list(regs), 0)


class DatapathTB:
    """One Datapath under test (see the module docstring)."""

    def __init__(self, dut):
        self.dut = dut
        self.top = bench.design()
        self.cfg = self.top.cfg
        self.words = {Space.ABUF: self.cfg.abuf_words, Space.WBUF: self.cfg.wbuf_words}
        self.held = {space: np.zeros(self.words[space], np.uint16) for space in SPACES}
        self.P = self.top.port_words
        dut.load.value = 0
        dut.dump.value = 0
        dut.issue__valid.value = 0
        self.records = []
        args = bench.args()
        self.issue_probability = float(args.get("issue_valid_probability", 1.0))
        self.rng = random.Random(args.get("seed", 0))
        self.issue_gaps = 0
        """Cycles the issue stream held valid low in front of an instruction, summed."""
        self.contended = False
        """Whether `contend` runs: the busy cycles then include other readers' turns and are not recorded."""
        if "contend" in self.top.signature.members:
            dut.contend__en.value = 0
            dut.contend__urgent.value = 0
            dut.contend__addr.value = 0
        if "contend_write" in self.top.signature.members:
            dut.contend_write__en.value = 0
            dut.contend_write__mask.value = 0
            dut.contend_write__urgent.value = 1

    def contend(self, probability: float) -> None:
        """Urgent reads of random ABUF words on the harness's `contend` port in a random `probability` of the
        cycles, which take their memories before the unit's tile ports and shared reads (their words are not
        checked), and as often writes of no word on `contend_write` where the harness has it, which take their
        memories before the unit's writes; the busy cycles are then not recorded for the cycle table."""
        self.contended = True
        writes = "contend_write" in self.top.signature.members

        async def reads():
            falling, chunk = FallingEdge(self.dut.clk), self.cfg.buffer_chunk_words
            while True:
                await falling
                self.dut.contend__en.value = int(self.rng.random() < probability)
                self.dut.contend__urgent.value = 1
                self.dut.contend__addr.value = self.rng.randrange(self.cfg.abuf_words - chunk)
                if writes:          # of no word (mask 0), claiming their memories
                    self.dut.contend_write__en.value = int(self.rng.random() < probability)
                    self.dut.contend_write__addr.value = self.rng.randrange(self.cfg.abuf_words - chunk)
        cocotb.start_soon(reads())

    async def start(self):
        await bench.start(self.dut)
        await FallingEdge(self.dut.clk)

    async def sync(self, state: dict) -> int:
        """Writes the P-word chunks of `state` that differ from what the design holds; returns how many."""
        count = 0
        layout = self.top.load_layout
        falling = FallingEdge(self.dut.clk)
        for space in SPACES:
            new = state[space].reshape(-1, self.P)
            old = self.held[space].reshape(-1, self.P)
            for chunk in np.nonzero((new != old).any(axis=1))[0]:
                self.dut.load.value = bench.pack(layout, {"en": 1, "space": space.value, "addr": int(chunk) * self.P,
                                                          "data": [int(v) for v in new[chunk]]})
                await falling
                count += 1
            self.held[space] = state[space].copy()
        self.dut.load.value = 0
        return count

    async def dump(self) -> dict:
        """Both buffers, read back through the dump port."""
        out = {}
        layout = self.top.dump_layout
        falling = FallingEdge(self.dut.clk)
        mask = (1 << 16) - 1
        for space in SPACES:
            chunks = self.words[space] // self.P
            words = np.zeros(self.words[space], np.uint16)
            for chunk in range(chunks + 1):
                if chunk:      # the data of the address set one cycle ago
                    value = self.dut.dump_data.value.to_unsigned()
                    base = (chunk - 1) * self.P
                    for i in range(self.P):
                        words[base + i] = (value >> (16 * i)) & mask
                if chunk < chunks:
                    self.dut.dump.value = bench.pack(layout, {"space": space.value, "addr": chunk * self.P})
                    await falling
            out[space] = words
        return out

    async def execute(self, word: int, regs, *, bound: int) -> tuple[ErrorCode, int, int]:
        """Issues `word` with `regs`; returns (error code, the unit's busy cycles, cycles seen here)."""
        dut = self.dut
        assert dut.issue__ready.value, "the unit is not ready for an instruction"
        payload = bench.pack(IssueLayout, {"inst": word, "regs": [int(r) for r in regs]})
        source = bench.StreamSource(dut, "issue", [payload], valid_probability=self.issue_probability, rng=self.rng)
        falling, settled = FallingEdge(dut.clk), ReadOnly()
        while not source.done:
            if not source.presenting:       # valid low: garbage the unit must not take
                dut.issue__payload.value = self.rng.getrandbits(IssueLayout.size)
            source.drive()
            await settled
            source.sample()
            await falling
            self.issue_gaps += not source.done
        source.drive()                      # valid low again
        for cycle in range(1, bound + 1):
            if dut.status__done.value:
                return ErrorCode(int(dut.status__error.value)), int(dut.status__cycles.value), cycle
            await falling
        raise AssertionError(f"no done within {bound} cycles: the unit hangs")

    async def check_back_to_back(self, instructions: list, regs, state: dict, *, label: str = "") -> None:
        """Loads `state`, offers all `instructions` on the issue stream at once (each is taken the cycle the unit
        is ready again, as from the controller's queue) and compares both buffers with the functional
        simulator's after the same sequence: a beat of one instruction still in a pipeline must not act for
        the next."""
        await self.sync(state)
        expected = state
        for inst in instructions:
            expected = golden(self.cfg, expected, inst, regs)
        dut = self.dut
        payloads = [bench.pack(IssueLayout, {"inst": inst.encode(), "regs": [int(r) for r in regs]})
                    for inst in instructions]
        source = bench.StreamSource(dut, "issue", payloads, valid_probability=1.0, rng=self.rng)
        falling, settled = FallingEdge(dut.clk), ReadOnly()
        dones = 0
        for _ in range(400 * len(instructions) + sum(4 * instruction_cost(resolved_of(i, regs), self.cfg).cycles
                                                     for i in instructions)):
            source.drive()
            await settled
            source.sample()
            dones += int(dut.status__done.value)
            await falling
            if dones == len(instructions):
                break
        source.drive()
        assert dones == len(instructions), f"{label}: {dones} of {len(instructions)} instructions completed"
        got = await self.dump()
        for space in SPACES:
            bad = np.nonzero(got[space] != expected[space])[0]
            assert not len(bad), (f"{label}: {len(bad)} words of {space.name} differ after back-to-back "
                                  f"{[str(i) for i in instructions]}, first at {bad[:8]}")
        self.held = {space: got[space].copy() for space in SPACES}

    async def check_instruction(self, inst: Instruction, regs, state: dict, *, label: str = "",
                                word: int | None = None, error: ErrorCode = ErrorCode.NONE) -> int:
        """Loads `state`, runs `inst` (or the raw `word`), and compares both buffers with the
        functional simulator (or, for an expected error, with `state` unchanged). Returns the busy cycles."""
        await self.sync(state)
        expected = state if error is not ErrorCode.NONE else golden(self.cfg, state, inst, regs)
        cost = instruction_cost(resolved_of(inst, regs), self.cfg).cycles if error is ErrorCode.NONE else 0
        code, cycles, seen = await self.execute(inst.encode() if word is None else word, regs,
                                                bound=4 * cost + 400)
        got = await self.dump()
        assert code == error, f"{label} {inst}: error {code.name}, expected {error.name}"
        for space in SPACES:
            bad = np.nonzero(got[space] != expected[space])[0]
            if len(bad):
                lines = [f"  {space.name}[{a}]: got {got[space][a]:#06x}, expected {expected[space][a]:#06x} "
                         f"(before {state[space][a]:#06x})" for a in bad[:12]]
                raise AssertionError(f"{label} {inst} regs={list(regs)}: {len(bad)} words of {space.name} differ\n"
                                     + "\n".join(lines))
        self.held = {space: got[space].copy() for space in SPACES}
        if error is ErrorCode.NONE and not self.contended:
            r = resolved_of(inst, regs)
            self.records.append({"op": inst.opcode.name, "rows": r.rows, "n": r.n, "k": r.k,
                                 "flags": [f for f in r.flags._fields if getattr(r.flags, f)],
                                 "rtl_cycles": cycles, "model_cycles": cost, "text": str(inst)})
        return cycles

    async def check_contended(self, cases, *, probability: float = 0.5) -> None:
        """Runs `cases` ((inst, regs, state) each) as `check_instruction` while `contend` takes ABUF memories in a
        `probability` of the cycles: every word still bit-exact, and the unit waited for its reads (some
        instruction took more busy cycles than the cycle model's count for it alone)."""
        self.contend(probability)
        waited = 0
        for index, (inst, regs, state) in enumerate(cases):
            cycles = await self.check_instruction(inst, regs, state, label=f"contended #{index}")
            waited += cycles - instruction_cost(resolved_of(inst, regs), self.cfg).cycles
        cocotb.log.info("%d contended instructions bit-exact, %d cycles waited", len(cases), waited)
        assert waited > 0, "the contending reads never delayed the unit"

    def save_records(self, path: str | None) -> None:
        if path:
            with open(path, "a") as out:
                for record in self.records:
                    out.write(json.dumps(record) + "\n")
        cocotb.log.info("%d instructions bit-exact (issue valid probability %.2f, %d gap cycles)",
                        len(self.records), self.issue_probability, self.issue_gaps)


# --- operand data ----------------------------------------------------------------------------

SPECIALS = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF,
                     0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7FFF], np.uint16)
"""Signed zeros, subnormals, smallest normal, largest finite, Inf, NaNs (quiet and signalling)."""


def fp16_data(rng: np.random.Generator, n: int, *, scale: float = 1.0, specials: float = 0.03) -> np.ndarray:
    """Mostly normal values of `scale`, a fraction `specials` drawn from SPECIALS."""
    values = nx.fp16_bits((rng.normal(0.0, scale, n)).astype(np.float16))
    pick = rng.random(n) < specials
    return np.where(pick, rng.choice(SPECIALS, n), values).astype(np.uint16)


def random_state(rng: np.random.Generator, cfg) -> dict:
    return {Space.ABUF: fp16_data(rng, cfg.abuf_words), Space.WBUF: fp16_data(rng, cfg.wbuf_words)}


def register_relative(rng: np.random.Generator, regs: list, value: int, *, chance: float = 0.3,
                      imm_bits: int = 32) -> tuple[int, int]:
    """(reg, imm) with imm + R[reg] = value (mod 2**32): a random free register R1..R15 some of the time."""
    free = [r for r in range(1, NUM_REGS) if regs[r] is None]
    if not free or rng.random() >= chance:
        return 0, value
    reg = int(rng.choice(free))
    part = int(rng.integers(0, value + 1)) if imm_bits < 32 else int(rng.integers(0, 1 << 32))
    regs[reg] = part
    return reg, (value - part) % (1 << 32)


def finish_regs(rng: np.random.Generator, regs: list) -> list:
    """Unused registers (R0 included: it must read 0) get random values."""
    return [int(rng.integers(0, 1 << 32)) if r is None else r for r in regs]


def new_regs() -> list:
    return [None] * NUM_REGS
