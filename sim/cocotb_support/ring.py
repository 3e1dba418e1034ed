"""Routers on a ring in one simulation: `RouterRing`, an Amaranth top of `cards` single-instruction harnesses
(hw.core.datapath.Datapath("router"): a router with its own ABUF and WBUF), and `RingTB`, its cocotb bench.

The ring's size is an input (`size`, 1..cards), so one build serves rings of every size up to `cards`: card c
of a ring of s sends to card (c + 1) mod s (s = 1: a card's link loops back to itself); cards past the size
are off the ring. Bit c of `pause` holds link c (out of card c) still for a cycle: the receiver sees no
tvalid and the sender no tready, back-pressure the bench sets at random. Every card's harness ports are
top-level ports prefixed `c<index>_` (`c0_issue__valid`, `c1_load`, ...), and `CardPorts` presents them
under their harness names, so `DatapathTB` drives each card as it drives a lone harness.
"""
from __future__ import annotations

import dataclasses
import functools
import random

import cocotb
import numpy as np
from amaranth.hdl import ClockSignal, Instance, Module, ResetSignal
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from cocotb.triggers import ClockCycles, Combine, FallingEdge, RisingEdge

from ringgpt.hw import numerics as nx
from ringgpt.hw.core.datapath import Datapath
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.isa import Instruction, Opcode, Space
from ringgpt.hw.resolved import Decoded
from ringgpt.sim.functional.machine import Card, State, run_ring

from . import bench
from .datapath import DatapathTB


HARNESS_MODULE = "ringgpt_router_harness"


@functools.cache
def harness_verilog(config: str, abuf_words: int, wbuf_words: int) -> str:
    from ringgpt.hw.verilog import convert

    return convert(Datapath("router", config, abuf_words, wbuf_words), name=HARNESS_MODULE)


class RouterRing(wiring.Component):
    """`cards` router harnesses on a ring of `size` (see the module docstring). The harness is converted to
    Verilog once (`verilog_modules`) and instantiated per card."""

    def __init__(self, cards: int = 3, config: str = "sim-small", abuf_words: int = 2048, wbuf_words: int = 64):
        self.cards, self.harness_args = cards, (config, abuf_words, wbuf_words)
        self.harness = Datapath("router", config, abuf_words, wbuf_words)
        self.harness._MustUse__silence = True       # its Verilog comes from harness_verilog
        self.cfg, self.port_words, self.unit = self.harness.cfg, self.harness.port_words, self.harness.unit
        self.load_layout, self.dump_layout = self.harness.load_layout, self.harness.dump_layout
        self.unit._MustUse__silence = True
        members = {"size": In(range(cards + 1)), "pause": In(cards)}
        for c in range(cards):
            members.update({f"c{c}_{name}": self.harness.signature.members[name]
                            for name in ("issue", "status", "load", "dump", "dump_data")})
        super().__init__(members)

    @property
    def latency(self) -> int:
        return self.unit.latency

    def verilog_modules(self) -> str:
        return harness_verilog(*self.harness_args)

    def elaborate(self, platform):
        m = Module()
        harnesses = []
        for c in range(self.cards):
            card = self.harness.signature.create(path=(f"card{c}",))
            ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
            for path, member, value in self.harness.signature.flatten(card):
                ports[("i_" if member.flow == In else "o_") + "__".join(map(str, path))] = value
            m.submodules[f"card{c}"] = Instance(HARNESS_MODULE, **ports)
            for name in ("issue", "status", "load", "dump", "dump_data"):
                member, inner, outer = self.harness.signature.members[name], getattr(card, name), \
                    getattr(self, f"c{c}_{name}")
                if member.is_port:
                    m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
                elif member.flow == In:
                    wiring.connect(m, wiring.flipped(outer), inner)
                else:
                    wiring.connect(m, inner, wiring.flipped(outer))
            m.d.comb += [card.card_id.eq(c), card.cards.eq(self.size)]
            harnesses.append(card)
        with m.Switch(self.size):
            for size in range(1, self.cards + 1):
                with m.Case(size):
                    for c in range(size):
                        tx, rx, held = harnesses[c].tx, harnesses[(c + 1) % size].rx, self.pause[c]
                        m.d.comb += [rx.tdata.eq(tx.tdata), rx.tlast.eq(tx.tlast), rx.tvalid.eq(tx.tvalid & ~held),
                                     tx.tready.eq(rx.tready & ~held)]
        return m


class CardPorts:
    """Card `index`'s ports of a RouterRing under their harness names (clk and rst are shared)."""

    def __init__(self, dut, index: int):
        self._dut, self._prefix = dut, f"c{index}_"

    def __getattr__(self, name: str):
        return getattr(self._dut, name if name in ("clk", "rst") else self._prefix + name)


@dataclasses.dataclass
class Outcome:
    """What one card's instruction ended with."""
    error: ErrorCode | None
    """None: no done within the cycle limit."""
    cycles: int = 0
    stopped: str = ""
    """Why there was no done (the bench's message)."""


class RingTB:
    """A RouterRing under test, its first `size` cards on the ring (`resize`), beside as many functional-simulator
    cards: `run` issues the cards' programs, one instruction per card at a time, all cards at once, waits for
    every done (a card without one within the cycle limit is reported by card, instruction and what it waits
    for) and runs the same programs on the functional cards; `check` compares every ABUF word of every card
    with them."""

    def __init__(self, dut, *, seed: int, pause_probability: float = 0.0):
        self.dut = dut
        top = bench.design()
        self.unit = top.unit
        self.cards = [DatapathTB(CardPorts(dut, c)) for c in range(top.cards)]
        for c, tb in enumerate(self.cards):
            tb.rng = random.Random(seed * len(self.cards) + c)
        self.rng = random.Random(seed)
        self.pause_probability = pause_probability
        dut.pause.value = 0
        self.resize(len(self.cards))

    def resize(self, size: int) -> None:
        """Cards 0 .. size - 1 on the ring (the functional cards start from what their RTL cards hold)."""
        self.size = size
        self.dut.size.value = size
        self.cfg = dataclasses.replace(self.cards[0].cfg, cards=size)
        self.golden = [Card(c, self.cfg, [], 0, 0) for c in range(size)]
        for tb, golden in zip(self.cards, self.golden):
            golden.mem[Space.ABUF][:] = nx.fp16_from_bits(tb.held[Space.ABUF])

    async def start(self, state: list[np.ndarray]):
        """Clock, reset, the link pauses, and every card's ABUF loaded with `state[c]`."""
        await bench.start(self.dut)
        await FallingEdge(self.dut.clk)
        if self.pause_probability:
            cocotb.start_soon(self._pause_links())
        await self.load(state)

    async def load(self, state: list[np.ndarray]):
        for tb, golden, words in zip(self.cards, self.golden, state):
            await tb.sync({Space.ABUF: words, Space.WBUF: tb.held[Space.WBUF]})
            golden.mem[Space.ABUF][:] = nx.fp16_from_bits(words)

    async def reset(self):
        """Reset pulse: empties every router's queues (the buffers keep their words)."""
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 2)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)      # the units' START state
        await FallingEdge(self.dut.clk)

    async def _pause_links(self):
        falling, cards = FallingEdge(self.dut.clk), len(self.cards)
        while True:
            await falling
            self.dut.pause.value = sum(int(self.rng.random() < self.pause_probability) << c for c in range(cards))

    async def run(self, programs: list, *, bound: int, golden: bool = True) -> list[list[Outcome]]:
        """programs[c]: card c's instructions [(instruction, registers)], the same registers for all of a card's
        instructions. Issues the first instruction of every card at once, waits for every done, then the
        second, and so on; returns the Outcomes of each such step. With `golden` the functional cards run the
        whole programs first (their errors propagate)."""
        if golden:
            self._golden_run(programs)
        steps = []
        for index in range(max(len(program) for program in programs)):
            steps.append(await self.step([program[index] if index < len(program) else None for program in programs],
                                         bound=bound))
        return steps

    async def step(self, program: list, *, bound: int) -> list[Outcome]:
        """Issues program[c] = (instruction, registers) or None on every card c at once and waits for every
        done (or the cycle limit); returns each card's Outcome."""
        outcomes = [Outcome(None if item else ErrorCode.NONE) for item in program]

        async def run(index: int, item):
            inst, regs = item
            try:
                code, cycles, _ = await self.cards[index].execute(inst.encode(), regs, bound=bound)
            except AssertionError as stopped:
                outcomes[index].stopped = str(stopped)
                return
            outcomes[index] = Outcome(code, cycles)
        tasks = [cocotb.start_soon(run(c, item)) for c, item in enumerate(program) if item is not None]
        await Combine(*tasks)
        await FallingEdge(self.dut.clk)
        return outcomes

    def _golden_run(self, programs: list) -> None:
        halt = Decoded(Instruction.make(Opcode.HALT))
        for card, program in zip(self.golden, programs):
            regs = {tuple(r) for _, r in program}
            if len(regs) > 1:
                raise ValueError(f"card {card.index}: one register file per program, got {len(regs)}")
            card.program = [Decoded(inst) for inst, _ in program] + [halt]
            card.pc, card.state, card.pending, card.trace = 0, State.RUNNING, None, []
            card.regs = list(regs.pop()) if regs else [0] * 16
        run_ring(self.golden, max_steps=len(max(programs, key=len)) + 1)

    @staticmethod
    def stuck(program: list, outcomes: list[Outcome], bound: int) -> str:
        """The cards that gave no done, with their instruction and what it waits for."""
        lines = []
        for c, (item, outcome) in enumerate(zip(program, outcomes)):
            if outcome.error is None:
                what = {Opcode.RECV: "waits in RECV for a block from the previous card",
                        Opcode.ALLGATHER: "waits in ALLGATHER for the other cards' slices",
                        Opcode.SEND: "waits in SEND for the next card to take its block"}[item[0].opcode]
                lines.append(f"card {c} at {item[0]}: {outcome.stopped}; {what}")
        return "\n".join(lines)

    async def check(self, label: str) -> None:
        """Every ABUF word of every card against its functional card."""
        for c, (tb, golden) in enumerate(zip(self.cards, self.golden)):
            got = (await tb.dump())[Space.ABUF]
            tb.held = {Space.ABUF: got, Space.WBUF: tb.held[Space.WBUF]}
            expected = nx.fp16_bits(golden.mem[Space.ABUF])
            bad = np.nonzero(got != expected)[0]
            if len(bad):
                lines = [f"  ABUF[{a}]: got {got[a]:#06x}, expected {expected[a]:#06x}" for a in bad[:12]]
                raise AssertionError(f"{label}: card {c} of {self.size}: {len(bad)} ABUF words differ\n"
                                     + "\n".join(lines))
