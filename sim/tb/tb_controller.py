"""cocotb testbench of the controller, the fetch unit and the scoreboard (`ControlHarness`: Controller + Fetch
wired as the core wires them), with the program in a cocotbext-axi `AxiRamRead` under random pauses and the
four units replaced by mock units written here: each takes its issue stream with random ready, works a
random number of cycles and completes, with an error where the test asks for one.

Goldens (Python): the register values at each instruction from isa.control_result in program order, the
footprints from hw/resolved (resolve_run, access_ranges). Checked on every run: every unit instruction before
the HALT reaches its unit exactly once, in program order per unit, with the registers of that point; an
instruction is taken by its unit only after every earlier one it conflicts with (RAW, WAR, WAW in any space,
across units) has completed; after a BARRIER nothing is taken before everything before it has completed; `done`
comes after the last completion; nothing after the HALT is issued; `error`, `error_pc`, `pc`, `cycles` and the
busy counters. Across the random programs, instructions of different units run at the same time.
"""
from __future__ import annotations

import dataclasses
import random

import cocotb
from amaranth.hdl import Module
from amaranth.lib import wiring
from cocotb.triggers import FallingEdge, ReadOnly
from cocotbext.axi import AxiRamRead, AxiReadBus

from ringgpt.hw.config import get_config
from ringgpt.hw.core.controller import REGISTER_WRITES, Controller
from ringgpt.hw.core.fetch import Fetch
from ringgpt.hw.core.interfaces import ErrorCode, IssueLayout
from ringgpt.hw.isa import (DIM_IMM_BITS, EXECUTING_UNITS, HOST_POS_REG, HOST_ROWS_REG, INSTRUCTION_BITS, INSTRUCTION_BYTES,
                            NUM_REGS, OPCODES, REG_BITS, STRIDE_BITS, Dim, Flags, IllegalInstructionError,
                            Instruction, Opcode, Operand, Space, Unit, control_result, decode)
from ringgpt.hw.resolved import access_ranges, hazard, resolve_run, with_gather_slices
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.cocotb_support.cases import pauses

UNIT_OPCODES = [op for op, spec in OPCODES.items() if spec.unit is not Unit.CONTROL]
MEMORY_BYTES = 1 << 20


class ControlHarness(wiring.Component):
    """Controller + Fetch of `config` (queue_depth overridable), wired as the core wires them: every member of
    the controller but `fetch`, and fetch's `prog` AXI4 port, are members of the harness."""

    def __init__(self, config: str = "sim-small", queue_depth: int | None = None):
        cfg = get_config(config)
        self.cfg = cfg if queue_depth is None else dataclasses.replace(cfg, queue_depth=queue_depth)
        self.controller = Controller(self.cfg)
        self.fetcher = Fetch(self.cfg)
        self.passed = {name: member for name, member in self.controller.signature.members.items() if name != "fetch"}
        super().__init__({**self.passed, "prog": self.fetcher.signature.members["prog"]})

    def elaborate(self, platform):
        m = Module()
        m.submodules.controller, m.submodules.fetch = self.controller, self.fetcher
        wiring.connect(m, self.controller.fetch, self.fetcher.control)
        wiring.connect(m, wiring.flipped(self.prog), self.fetcher.prog)
        for name, member in self.passed.items():
            outer, inner = getattr(self, name), getattr(self.controller, name)
            if member.is_signature:
                wiring.connect(m, wiring.flipped(outer), inner)
            elif member.flow == wiring.Out:
                m.d.comb += outer.eq(inner)
            else:
                m.d.comb += inner.eq(outer)
        return m


# --- programs --------------------------------------------------------------------------------------------

ADDRESS_REGS = (3, 4, 5)
"""Registers the random programs' control instructions change and their operands are relative to."""


def random_instruction(rng: random.Random, opcode: Opcode | None = None, *, small: bool = False) -> Instruction:
    """A random legal instruction of a unit opcode. `small`: operands within a few hundred words, relative to
    ADDRESS_REGS or R1/R2, and small dimensions (frequent overlaps); otherwise any width, register-relative
    fields, zero dimensions and blocks past 2**32 included."""
    opcode = opcode or rng.choice(UNIT_OPCODES)
    spec = OPCODES[opcode]
    flags = {f: rng.randrange(2) for f in spec.flags}
    fields = {}
    for name, spaces in spec.operands.items():
        for flag in (f for f, on in flags.items() if on):     # a set flag may narrow an operand's spaces
            spaces = spec.flag_operands.get(flag, {}).get(name, spaces)
        space = rng.choice(spaces)
        if space is Space.NONE:
            continue
        if space is Space.IMM:
            fields[name] = Operand(space, 0, rng.randrange(1 << 16))
        elif small:
            fields[name] = Operand(space, rng.choice((0, 0, HOST_POS_REG) + ADDRESS_REGS), rng.randrange(256))
        else:
            fields[name] = Operand(space, rng.choice([0, rng.randrange(NUM_REGS)]),
                                   rng.choice([rng.randrange(1 << 32), rng.randrange(1 << 12)]))
    for name in spec.dims:
        if small:
            fields[name] = Dim(rng.choice([0, 0, 0, HOST_ROWS_REG]), rng.choice([0, 1, 2, 3, 8, 17]))
        else:
            fields[name] = Dim(rng.choice([0, rng.randrange(NUM_REGS)]),
                               rng.choice([0, 1, rng.randrange(64), rng.randrange(1 << DIM_IMM_BITS)]))
    unread = {name for flag, names in spec.flag_fields.items() if not flags[flag] for name in names}
    for name in spec.strides:
        fields[name] = 0 if name in unread else rng.choice([0, 1, 8, rng.randrange(64)] if small else
                                                           [0, 1, rng.randrange(64), rng.randrange(1 << STRIDE_BITS)])
    fields["flags"] = Flags(**flags)
    return Instruction.make(opcode, **fields)


def random_control(rng: random.Random) -> Instruction:
    """SETI, ADDI, MULI or ADD on ADDRESS_REGS (now and then R0, which stays 0, or a wrapping value)."""
    opcode = rng.choice(REGISTER_WRITES)
    rd = rng.choice(ADDRESS_REGS + (0,)) if rng.random() < 0.1 else rng.choice(ADDRESS_REGS)
    sources = ADDRESS_REGS + (0, HOST_POS_REG, HOST_ROWS_REG)
    imm = rng.choice([rng.randrange(-4, 64), rng.randrange(-(1 << 31), 1 << 31)] if opcode is not Opcode.MULI
                     else [rng.randrange(-2, 4), rng.randrange(-(1 << 31), 1 << 31)])
    fields = {"rd": rd, "rs": rng.choice(sources), "rt": rng.choice(sources), "imm": imm}
    if opcode is Opcode.SETI:
        imm = rng.randrange(-4, 64) if rng.random() < 0.9 else imm
        fields = {"rd": rd, "imm": imm}
    elif opcode is Opcode.ADD:
        del fields["imm"]
    else:
        del fields["rt"]
    return Instruction.make(opcode, **fields)


def random_program(rng: random.Random, length: int) -> list:
    """`length` instructions (units, control, NOP, a few BARRIERs), a HALT, then words that must never run:
    unit instructions and illegal words."""
    program = []
    for _ in range(length):
        roll = rng.random()
        if roll < 0.25:
            program.append(random_control(rng))
        elif roll < 0.31:
            program.append(Instruction.make(rng.choice((Opcode.NOP, Opcode.BARRIER))))
        else:
            program.append(random_instruction(rng, small=True))
    program.append(Instruction.make(Opcode.HALT))
    return [inst.encode() for inst in program] + \
        [random_instruction(rng, small=True).encode() for _ in range(3)] + [illegal_word(rng) for _ in range(2)]


def illegal_word(rng: random.Random) -> int:
    """A word isa.decode rejects: a legal one with random bits flipped."""
    while True:
        word = random_instruction(rng, small=True).encode() ^ (1 << rng.randrange(INSTRUCTION_BITS))
        try:
            decode(word)
        except IllegalInstructionError:
            return word


@dataclasses.dataclass
class Expected:
    """What the program does up to its first HALT or illegal word (`end`, its pc): the unit instructions
    (pc, word, registers at that point), their footprints by pc, the BARRIERs' pcs."""
    issued: list
    ranges: dict
    barriers: list
    end: int


def expected_run(words: list, pos: int, rows: int) -> Expected:
    regs = [0] * NUM_REGS
    regs[HOST_POS_REG], regs[HOST_ROWS_REG] = pos, rows
    issued, barriers, program = [], [], []
    for pc, word in enumerate(words):
        try:
            inst = decode(word)
        except IllegalInstructionError:
            break
        program.append(inst)
        if inst.opcode is Opcode.HALT:
            break
        if inst.opcode is Opcode.BARRIER:
            barriers.append(pc)
        if OPCODES[inst.opcode].unit is Unit.CONTROL:
            if inst.opcode in REGISTER_WRITES and inst.rd:
                regs[inst.rd] = control_result(inst.opcode, regs, inst.rs, inst.rt, inst.imm)
        else:
            issued.append((pc, word, list(regs)))
    resolved = with_gather_slices([resolve_run(program, 0, pos, rows)])[0]
    ranges = {pc: access_ranges(r) for pc, r in enumerate(resolved) if r is not None}
    return Expected(issued, ranges, barriers, len(program) - 1 if program and program[-1].opcode is Opcode.HALT
                    else len(program))


# --- the bench ---------------------------------------------------------------------------------------------

class ProgramMemory(AxiRamRead):
    """The program memory; reads of [faulty_lo, faulty_hi) answer SLVERR."""

    faulty = (0, 0)

    async def _read(self, address, length):
        lo, hi = self.faulty
        if lo <= address < hi:
            raise ValueError(f"no memory at {address:#x}")
        return await super()._read(address, length)



class MockUnit:
    """One unit: takes an instruction when idle (ready with probability `ready_probability`), completes it after
    a random 1..`max_latency` cycles (`errors`: index in its instruction order -> ErrorCode to complete with;
    `slow`: index -> latency), reports accept..done inclusive as its busy cycles."""

    def __init__(self, dut, unit: Unit, rng: random.Random):
        self.unit, self.rng = unit, rng
        name = unit.name.lower()
        self.valid, self.ready = getattr(dut, f"issue_{name}__valid"), getattr(dut, f"issue_{name}__ready")
        self.payload = getattr(dut, f"issue_{name}__payload")
        self.done = getattr(dut, f"status_{name}__done")
        self.error = getattr(dut, f"status_{name}__error")
        self.cycles = getattr(dut, f"status_{name}__cycles")
        self.ready.value = self.done.value = 0
        self.configure()

    def configure(self, *, ready_probability: float = 0.7, max_latency: int = 12, errors: dict | None = None,
                  slow: dict | None = None):
        self.ready_probability, self.max_latency = ready_probability, max_latency
        self.errors, self.slow = errors or {}, slow or {}
        self.taken = []        # (accept cycle, word, regs)
        self.completed = []    # done cycle, per taken instruction
        self.busy_cycles = 0
        self.remaining = None  # cycles to done of the instruction held, None when idle

    def drive(self, now: int):
        if self.remaining is None:
            self.ready.value = int(self.rng.random() < self.ready_probability)
            self.done.value = 0
            return
        self.ready.value = 0
        self.remaining -= 1
        if self.remaining == 0:
            index = len(self.completed)
            accepted = self.taken[index][0]
            self.done.value = 1
            self.error.value = self.errors.get(index, ErrorCode.NONE).value
            self.cycles.value = now - accepted
            self.busy_cycles += now - accepted
            self.completed.append(now)
            self.remaining = None
        else:
            self.done.value = 0

    def sample(self, now: int):
        if self.remaining is None and self.ready.value and self.valid.value:
            value = self.payload.value.to_unsigned()
            inst = value >> IssueLayout["inst"].offset & ((1 << INSTRUCTION_BITS) - 1)
            regs = [value >> (IssueLayout["regs"].offset + REG_BITS * i) & ((1 << REG_BITS) - 1)
                    for i in range(NUM_REGS)]
            index = len(self.taken)
            self.taken.append((now, inst, regs))
            self.remaining = self.slow.get(index, self.rng.randint(1, self.max_latency))


class ControlTB:
    """The harness with its program memory and mock units (see the module docstring)."""

    def __init__(self, dut, seed: int):
        self.dut = dut
        self.top = bench.design()
        self.cfg = self.top.cfg
        self.rng = random.Random(seed)
        self.memory = ProgramMemory(AxiReadBus.from_prefix(dut, "prog_"), dut.clk, dut.rst, size=MEMORY_BYTES)
        self.units = {unit: MockUnit(dut, unit, self.rng) for unit in EXECUTING_UNITS}
        dut.start.value = 0
        self.now = 0
        self.overlaps = 0
        """Pairs of instructions of different units seen executing at the same time, over all runs."""
        self.barriers = 0
        """BARRIERs with instructions on both sides, over all runs."""
        self.bursts_in_flight = self.most_bursts_in_flight = 0
        """Read bursts the memory accepted and has not finished (now, and the most seen)."""

    async def reset(self):
        cocotb.start_soon(self.count_bursts())
        await bench.start(self.dut)

    async def count_bursts(self):
        dut = self.dut
        falling, settled = FallingEdge(dut.clk), ReadOnly()
        while True:
            await falling
            await settled
            if dut.prog__arvalid.value and dut.prog__arready.value:
                self.bursts_in_flight += 1
                self.most_bursts_in_flight = max(self.most_bursts_in_flight, self.bursts_in_flight)
            if dut.prog__rvalid.value and dut.prog__rready.value and dut.prog__rlast.value:
                self.bursts_in_flight -= 1

    def pause_memory(self, probability: float):
        for channel in (self.memory.ar_channel, self.memory.r_channel):
            channel.set_pause_generator(pauses(self.rng, probability) if probability else None)
            channel.pause = False   # a stopped generator may have left it paused

    async def run(self, words: list, *, base: int, pos: int, rows: int, max_cycles: int = 20000) -> dict:
        """Loads `words` at byte `base`, starts the run and steps every mock unit until `done`; returns the host
        outputs and the start and done cycles."""
        for pc, word in enumerate(words):
            self.memory.write(base + pc * INSTRUCTION_BYTES, word.to_bytes(INSTRUCTION_BYTES, "little"))
        dut = self.dut
        dut.pos.value, dut.rows.value, dut.program_base.value = pos, rows, base
        falling, settled = FallingEdge(dut.clk), ReadOnly()
        start = done = None
        for _ in range(max_cycles):
            await falling
            self.now += 1
            dut.start.value = int(start is None)
            if start is None:
                start = self.now
            for unit in self.units.values():
                unit.drive(self.now)
            await settled
            for unit in self.units.values():
                unit.sample(self.now)
            if self.now > start + 1 and dut.done.value:
                done = self.now
                break
        assert done is not None, (f"no done within {max_cycles} cycles: pc {int(dut.pc.value)}, busy "
                                  f"{int(dut.busy.value)}, error {ErrorCode(int(dut.error.value)).name}, instructions "
                                  f"taken {({u.name: len(m.taken) for u, m in self.units.items()})}")
        await falling
        dut.start.value = 0
        result = {name: int(getattr(dut, name).value) for name in ("error", "error_pc", "pc", "cycles", "busy")}
        result["error"] = ErrorCode(result["error"])
        result["unit_busy"] = {u: int(getattr(dut, f"busy_{u.name.lower()}").value) for u in self.units}
        result["start"], result["done"] = start, done
        return result

    def check(self, expected: Expected, result: dict, *, stopped_at: int | None = None) -> dict:
        """Checks the issue order, registers, hazards, barriers and counters of a run (see the module docstring);
        returns {pc: (unit, accept cycle, done cycle)} of the instructions the units took. `stopped_at`: the run
        stopped on an error at that pc, so instructions from there on may be missing."""
        per_unit = {unit: [] for unit in self.units}
        for pc, word, regs in expected.issued:
            per_unit[OPCODES[decode(word).opcode].unit].append((pc, word, regs))
        timeline = {}   # pc -> (unit, accept, done)
        for unit, mock in self.units.items():
            want = per_unit[unit]
            got = mock.taken
            if stopped_at is None:
                assert len(got) == len(want), f"{unit.name}: {len(got)} instructions taken, expected {len(want)}"
            for index, (accepted, word, regs) in enumerate(got):
                assert index < len(want), f"{unit.name}: instruction {decode(word)} taken beyond the program's"
                pc, want_word, want_regs = want[index]
                assert word == want_word, f"{unit.name} #{index}: got {decode(word)}, expected pc {pc}: " \
                                          f"{decode(want_word)}"
                assert regs == want_regs, f"pc {pc} {decode(word)}: registers {regs}, expected {want_regs}"
                timeline[pc] = (unit, accepted, mock.completed[index])
            if stopped_at is not None:
                missing = [pc for pc, _, _ in want[len(got):]]
                assert all(pc >= stopped_at for pc in missing), f"{unit.name}: pcs {missing} never ran"
        pcs = sorted(timeline)
        for j, later in enumerate(pcs):
            _, accepted, _ = timeline[later]
            for earlier in pcs[:j]:
                _, _, completed = timeline[earlier]
                if hazard(*expected.ranges[later], *expected.ranges[earlier]):
                    assert accepted > completed, (f"pc {later} was taken at cycle {accepted} before pc {earlier}, "
                                                  f"which it conflicts with, completed at {completed}")
        for j, a in enumerate(pcs):
            for b in pcs[j + 1:]:
                (unit_a, start_a, end_a), (unit_b, start_b, end_b) = timeline[a], timeline[b]
                self.overlaps += unit_a is not unit_b and start_b < end_a and start_a < end_b
        for barrier in expected.barriers:
            before = [timeline[pc][2] for pc in pcs if pc < barrier]
            after = [timeline[pc][1] for pc in pcs if pc > barrier]
            if before and after:
                assert min(after) > max(before), f"BARRIER at pc {barrier}: an instruction after it started early"
                self.barriers += 1
        if pcs:
            assert result["done"] > max(timeline[pc][2] for pc in pcs), "done before the last completion"
        assert result["cycles"] == result["done"] - result["start"] - 1, \
            f"cycles {result['cycles']}, start..done {result['start']}..{result['done']}"
        for unit, mock in self.units.items():
            assert result["unit_busy"][unit] == mock.busy_cycles, \
                f"busy_{unit.name.lower()} {result['unit_busy'][unit]}, the unit reported {mock.busy_cycles}"
        assert not result["busy"]
        return timeline


def configure_units(tb: ControlTB, rng: random.Random) -> None:
    for mock in tb.units.values():
        mock.configure(ready_probability=rng.choice([0.3, 0.7, 1.0]), max_latency=rng.choice([2, 8, 30]))


@cocotb.test()
async def random_programs(dut):
    """Random programs back to back (the next starts right after done, while fetch may still have bursts in
    flight), at random program addresses, with random memory pauses and unit latencies."""
    args = bench.args()
    tb = ControlTB(dut, args["seed"])
    await tb.reset()
    rng = tb.rng
    for index in range(args["programs"]):
        words = random_program(rng, rng.choice([5, 30, 80]))
        base = INSTRUCTION_BYTES * rng.randrange(MEMORY_BYTES // INSTRUCTION_BYTES - len(words))
        pos, rows = rng.randrange(8), rng.randrange(1, 8)
        tb.pause_memory(rng.choice([0, 0.3, 0.7]))
        configure_units(tb, rng)
        expected = expected_run(words, pos, rows)
        result = await tb.run(words, base=base, pos=pos, rows=rows)
        assert (result["error"], result["pc"]) == (ErrorCode.NONE, expected.end), \
            f"program {index}: {result['error']} at pc {result['pc']}, expected HALT at {expected.end}"
        tb.check(expected, result)
    cocotb.log.info("%d programs; %d overlapping pairs of different units, %d barriers, up to %d bursts in flight",
                    args["programs"], tb.overlaps, tb.barriers, tb.most_bursts_in_flight)
    assert tb.overlaps > 0, "independent instructions of different units never ran at the same time"
    assert tb.most_bursts_in_flight > 1, "fetch never had more than one burst in flight"


@cocotb.test()
async def errors_stop_the_run(dut):
    """An illegal word, a unit error, an AXI error, a misaligned program base, and two errors where the later
    seen has the lower pc: each ends with its code and pc, nothing after it issued; the core runs again
    afterwards."""
    tb = ControlTB(dut, 99)
    await tb.reset()
    rng = tb.rng
    tb.pause_memory(0.3)
    base = INSTRUCTION_BYTES * 40

    def program(length: int) -> list:
        return [random_instruction(rng, small=True).encode() for _ in range(length)]

    def unit_of(word: int) -> Unit:
        return OPCODES[decode(word).opcode].unit

    # an illegal word at pc 23
    words = program(23) + [illegal_word(rng)] + program(10)
    expected = expected_run(words, 1, 2)
    configure_units(tb, rng)
    result = await tb.run(words, base=base, pos=1, rows=2)
    assert (result["error"], result["error_pc"], result["pc"]) == (ErrorCode.ILLEGAL, 23, 23), result
    assert expected.end == 23
    tb.check(expected, result)

    # a unit error at pc 17: the run stops there; what was queued behind it may still run, nothing more
    words = program(40) + [Instruction.make(Opcode.HALT).encode()]
    expected = expected_run(words, 0, 1)
    unit = unit_of(words[17])
    configure_units(tb, rng)
    tb.units[unit].configure(ready_probability=1.0, errors={[unit_of(w) for w in words[:17]].count(unit):
                                                            ErrorCode.OUT_OF_RANGE})
    result = await tb.run(words, base=base, pos=0, rows=1)
    assert (result["error"], result["error_pc"]) == (ErrorCode.OUT_OF_RANGE, 17), result
    timeline = tb.check(expected, result, stopped_at=17)
    for mock in tb.units.values():
        after = [pc for pc, (u, _, _) in timeline.items() if u is mock.unit and pc > 17]
        assert len(after) <= tb.cfg.queue_depth + 1, f"{mock.unit.name} took {after} after the error"
    assert len([pc for pc in timeline if pc > 17]) < len(words) - 19, "the run kept issuing after the error"

    # an AXI error (SLVERR) on one beat (not the last) of the word at pc 9: BUS at pc 9, everything before it runs
    words = program(30) + [Instruction.make(Opcode.HALT).encode()]
    expected = expected_run(words, 0, 1)
    beat = tb.cfg.hbm_port_bits // 8
    tb.memory.faulty = (base + 9 * INSTRUCTION_BYTES + beat, base + 9 * INSTRUCTION_BYTES + 2 * beat)
    configure_units(tb, rng)
    result = await tb.run(words, base=base, pos=0, rows=1)
    tb.memory.faulty = (0, 0)
    assert (result["error"], result["error_pc"], result["pc"]) == (ErrorCode.BUS, 9, 9), result
    timeline = tb.check(expected, result, stopped_at=9)
    assert sorted(timeline) == [pc for pc, _, _ in expected.issued if pc < 9]

    # a misaligned program base: BUS at pc 0, nothing issued
    configure_units(tb, rng)
    result = await tb.run(words, base=base + 8, pos=0, rows=1)
    assert (result["error"], result["error_pc"]) == (ErrorCode.BUS, 0), result
    assert not any(m.taken for m in tb.units.values())

    # a unit error at pc 2 seen after an illegal word at pc 5: the lower pc is reported
    first = random_instruction(rng, Opcode.VADD, small=True).encode()
    words = [first] + program(1) + [random_instruction(rng, Opcode.VADD, small=True).encode()] + \
        [Instruction.make(Opcode.NOP).encode()] * 2 + [illegal_word(rng)]
    configure_units(tb, rng)
    vector = tb.units[Unit.VECTOR]
    vector.configure(ready_probability=1.0, errors={1 + (unit_of(words[1]) is Unit.VECTOR): ErrorCode.ZERO_DIM},
                     slow={1 + (unit_of(words[1]) is Unit.VECTOR): 200})
    result = await tb.run(words, base=base, pos=0, rows=1)
    assert (result["error"], result["error_pc"], result["pc"]) == (ErrorCode.ZERO_DIM, 2, 5), result

    # and it runs again
    words = random_program(rng, 30)
    expected = expected_run(words, 3, 4)
    configure_units(tb, rng)
    result = await tb.run(words, base=base, pos=3, rows=4)
    assert (result["error"], result["pc"]) == (ErrorCode.NONE, expected.end), result
    tb.check(expected, result)


@cocotb.test()
async def fetch_waits_for_room(dut):
    """A unit that holds its first instruction for a long time while the program behind it goes to the same
    unit: the queue fills, the head waits, and fetch must stop reading once its FIFO is promised full (no word
    lost or repeated), then go on."""
    tb = ControlTB(dut, 7)
    await tb.reset()
    rng = tb.rng
    tb.pause_memory(0)
    words = [random_instruction(rng, Opcode.MATMUL, small=True).encode() for _ in range(3 * tb.top.fetcher.depth)]
    words.append(Instruction.make(Opcode.HALT).encode())
    expected = expected_run(words, 0, 1)
    configure_units(tb, rng)
    tb.units[Unit.MATRIX].configure(ready_probability=1.0, max_latency=2, slow={0: 40 * tb.top.fetcher.depth})
    result = await tb.run(words, base=INSTRUCTION_BYTES * 3, pos=0, rows=1)
    assert (result["error"], result["pc"]) == (ErrorCode.NONE, expected.end), result
    tb.check(expected, result)
