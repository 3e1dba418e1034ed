"""The scoreboard's range logic and the controller's legality check, in Amaranth's own simulator: the RTL
footprint of random instructions against hw/resolved.access_ranges, the scoreboard's hazard decisions
over random push/complete sequences against the Python rule, and `illegal_word` against isa.decode on
mutated words."""
import random

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from ringgpt.hw.config import get_config
from ringgpt.hw.core.controller import illegal_word
from ringgpt.hw.core.interfaces import IssueLayout
from ringgpt.hw.core.scoreboard import (READ_OPERANDS, WRITE_OPERANDS, FootprintLayout, Scoreboard,
                                        footprint)
from ringgpt.hw.isa import (EXECUTING_UNITS, INSTRUCTION_BITS, NUM_REGS, OPCODES, IllegalInstructionError, Instruction,
                            InstructionLayout, Opcode, Space, decode)
from ringgpt.hw.resolved import ADDRESS_LIMIT, Decoded, hazard, scoreboard_ranges
from ringgpt.sim.tb.tb_controller import UNIT_OPCODES, random_instruction

def random_regs(rng: random.Random, *, small: bool = False) -> list:
    regs = [rng.choice([rng.randrange(1 << 32), rng.randrange(64)]) for _ in range(NUM_REGS)]
    if small:
        regs = [rng.randrange(4) for _ in range(NUM_REGS)]
    regs[0] = 0
    return regs


def golden_ranges(inst: Instruction, regs: list) -> tuple:
    """scoreboard_ranges of `inst` run on one card, hi capped at 2**32 as the RTL stores it."""
    resolved = Decoded(inst).resolve(regs, 0)
    if inst.opcode is Opcode.ALLGATHER:
        resolved = resolved._replace(slices=((resolved.n, resolved.k),))
    reads, writes = scoreboard_ranges(resolved)
    return ([(space, lo, min(hi, ADDRESS_LIMIT)) for space, lo, hi in reads],
            [(space, lo, min(hi, ADDRESS_LIMIT)) for space, lo, hi in writes])


class FootprintHarness(wiring.Component):
    issue: In(IssueLayout)
    footprint: Out(FootprintLayout)

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.footprint.eq(footprint(m, self.issue))
        return m


def _ranges(view, ctx, count):
    out = []
    for i in range(count):
        slot = view[i]
        space = ctx.get(slot.space)
        if space is not Space.NONE:
            out.append((space, ctx.get(slot.lo), ctx.get(slot.hi)))
    return out


def test_footprint_matches_access_ranges():
    dut = FootprintHarness()
    rng = random.Random(11)
    cases = [(random_instruction(rng, op), random_regs(rng)) for op in UNIT_OPCODES for _ in range(12)]
    cases += [(random_instruction(rng, small=True), random_regs(rng, small=True)) for _ in range(150)]

    async def bench(ctx):
        for inst, regs in cases:
            ctx.set(dut.issue, {"inst": InstructionLayout.from_bits(inst.encode()), "regs": regs})
            got = (_ranges(dut.footprint.reads, ctx, len(READ_OPERANDS)),
                   _ranges(dut.footprint.writes, ctx, len(WRITE_OPERANDS)))
            assert got == golden_ranges(inst, regs), f"{inst} regs {regs}"

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()


def test_scoreboard_hazards_follow_the_rule():
    """Random pushes and completions: `hazard` is true exactly when the candidate conflicts with an
    instruction of another unit in flight; `oldest_pc_<unit>` names the unit's oldest; `idle` when empty."""
    cfg = get_config("sim-small")
    dut = Scoreboard(cfg)
    rng = random.Random(5)

    async def bench(ctx):
        in_flight = {unit: [] for unit in EXECUTING_UNITS}   # unit -> [(pc, ranges)], oldest first
        hazards = 0
        for pc in range(400):
            inst, regs = random_instruction(rng, small=True), random_regs(rng, small=True)
            unit = OPCODES[inst.opcode].unit
            ranges = golden_ranges(inst, regs)
            ctx.set(dut.inst, InstructionLayout.from_bits(inst.encode()))
            ctx.set(dut.regs, regs)
            ctx.set(dut.unit, unit)
            ctx.set(dut.pc, pc)
            expected = any(hazard(*ranges, *old) for other, entries in in_flight.items() if other is not unit
                           for _, old in entries)
            assert ctx.get(dut.hazard) == expected, f"pc {pc}: {inst}"
            assert ctx.get(dut.idle) == (not any(in_flight.values()))
            hazards += expected
            push = not expected and len(in_flight[unit]) < dut.entries and rng.random() < 0.7
            ctx.set(dut.push, push)
            for other, entries in in_flight.items():
                name = other.name.lower()
                if entries:
                    assert ctx.get(getattr(dut, f"oldest_pc_{name}")) == entries[0][0]
                done = bool(entries) and rng.random() < 0.25
                ctx.set(getattr(dut, f"done_{name}"), done)
                if done:
                    entries.pop(0)
            if push:
                in_flight[unit].append((pc, ranges))
            await ctx.tick()
        assert hazards > 40

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


class LegalityHarness(wiring.Component):
    word: In(InstructionLayout)
    illegal: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.illegal.eq(illegal_word(m, self.word))
        return m


def mutated_words(rng: random.Random, count: int) -> list:
    """Legal words of every opcode, and each with one to three random bits flipped (mostly illegal)."""
    words = []
    for _ in range(count):
        opcode = rng.choice(list(Opcode))
        inst = random_instruction(rng, opcode) if opcode in UNIT_OPCODES else Instruction.make(
            opcode, **{f: (rng.randrange(-8, 8) if f == "imm" else rng.randrange(16)) for f in OPCODES[opcode].control})
        word = inst.encode()
        words.append(word)
        for _ in range(rng.randrange(1, 4)):
            word ^= 1 << rng.choice([rng.randrange(INSTRUCTION_BITS), rng.randrange(32)])
        words.append(word)
    return words


def is_illegal(word: int) -> bool:
    try:
        decode(word)
    except IllegalInstructionError:
        return True
    return False


def test_illegal_word_matches_decode():
    dut = LegalityHarness()
    words = mutated_words(random.Random(3), 400)

    async def bench(ctx):
        for word in words:
            ctx.set(dut.word, InstructionLayout.from_bits(word))
            assert ctx.get(dut.illegal) == is_illegal(word), f"word {word:#x}"

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    assert 100 < sum(map(is_illegal, words)) < len(words) - 100
