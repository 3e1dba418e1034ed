"""cocotb testbench of the vector unit in the single-instruction harness (Datapath("vector")): every
vector opcode with random rows and n (1, vector_width edges, non-multiples), strides, register-relative
operands and dimensions, row-scalar and IMM operands, in-place operation, and operand data with NaN,
Inf, signed zeros and subnormals (uniform random patterns for the special functions). Every word of
ABUF and WBUF is compared with the functional simulator after each instruction; then a LayerNorm and a
softmax as the compiler emits them; then bad instruction words (error code, nothing written)."""
import cocotb
import numpy as np

from ringgpt.hw import banks, numerics as nx
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.resolved import misaligned_vector
from ringgpt.hw.isa import OPCODES, Dim, Flags, Instruction, Opcode, Operand, Space, Unit, decode, opcodes_of
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.cocotb_support.datapath import (DatapathTB, finish_regs, fp16_data, golden, new_regs,
                                                 random_state, register_relative, resolved_of)
from ringgpt.sim.cycle_model.stalls import vector_operands, vector_stall_cycles
from ringgpt.sim.cocotb_support.cases import aligned_up, extent, pick, place, set_field, stride_for

VECTOR_OPS = opcodes_of(Unit.VECTOR)


def imm_value(rng) -> int:
    return int(pick(rng, [0x3C00, 0xBC00, 0x0000, 0x8000, 0x2118, 0x7C00, 0x7E00, 0x0001]) if rng.random() < 0.5
               else nx.fp16_bits(np.float16(rng.normal(0, 2))))


def vector_case(rng, cfg, op: Opcode):
    """A random instruction of `op` that keeps the vector unit's alignment rule (hw/resolved.misaligned_vector:
    src1 and the other ABUF operands but row scalars, and their strides, on vector_align boundaries), and its
    registers."""
    V, A = cfg.vector_width, cfg.vector_align
    spec = OPCODES[op]
    while True:
        rows = pick(rng, [1, 1, 2, 3, 4, 5, 6, 7, 9, 11, 13])
        n = pick(rng, [1, V - 1, V, V + 1, 2 * V, 3 * V + 3, rng.integers(1, 6 * V + 1)]) or 1
        s1 = aligned_up(stride_for(rng, n, overlap=True), A)
        aligned = ["src1"]
        reduces = spec.reduces
        dcols = 1 if reduces else n
        sd = stride_for(rng, dcols, overlap=False)
        flags, blocks, spaces, strides = {}, {"src1": extent(rows, n, s1)}, {}, {}
        for name, flag in (("src2", "src2_row_scalar"), ("aux", "aux_row_scalar")):
            if name not in spec.operands:
                continue
            if Space.IMM in spec.operands[name] and rng.random() < 0.3:
                spaces[name] = Space.IMM
                continue
            spaces[name] = Space.ABUF
            scalar = flag in spec.flags and rng.random() < 0.4
            if scalar:
                flags[flag] = 1
            cols = 1 if scalar else n
            strides[name] = stride_for(rng, cols, overlap=True)
            if not scalar:
                strides[name] = aligned_up(strides[name], A)
                aligned.append(name)
            blocks[name] = extent(rows, cols, strides[name])
        in_place = not reduces and s1 >= n and rng.random() < 0.25
        if in_place:
            sd = s1
        else:
            blocks["dst"] = extent(rows, dcols, sd)
        bases = place(rng, blocks, cfg.abuf_words, aligned, A)
        if bases is not None:
            break
    if in_place:
        bases["dst"] = bases["src1"]
    regs = new_regs()

    def operand(name):
        if spaces.get(name, Space.ABUF) == Space.IMM:
            return Operand(Space.IMM, 0, imm_value(rng))
        reg, offset = register_relative(rng, regs, bases[name])
        return Operand(Space.ABUF, reg, offset)
    fields = dict(dst=operand("dst"), src1=operand("src1"), rows=Dim(*register_relative(rng, regs, rows, imm_bits=28)),
                  n=Dim(*register_relative(rng, regs, n, imm_bits=28)), dst_stride=sd, src1_stride=s1,
                  flags=Flags(**flags))
    for name in ("src2", "aux"):
        if name in spaces:
            fields[name] = operand(name)
            if spaces[name] == Space.ABUF:
                fields[f"{name}_stride"] = strides[name]
    return Instruction.make(op, **fields), finish_regs(rng, regs)


def vector_state(rng, cfg, op):
    if OPCODES[op].special and rng.random() < 0.6:       # every pattern: the special functions' whole domain
        abuf = rng.integers(0, 1 << 16, cfg.abuf_words).astype(np.uint16)
    else:
        abuf = fp16_data(rng, cfg.abuf_words, scale=float(pick(rng, [1, 1, 4, 100])) / 1,
                         specials=float(pick(rng, [0, 0.02, 0.1])))
    return {Space.ABUF: abuf, Space.WBUF: fp16_data(rng, cfg.wbuf_words)}


@cocotb.test()
async def random_instructions_bit_exact(dut):
    args = bench.args()
    tb = DatapathTB(dut)
    await tb.start()
    rng = np.random.default_rng(args["seed"])
    for index in range(args["instructions"]):
        op = VECTOR_OPS[index % len(VECTOR_OPS)]
        inst, regs = vector_case(rng, tb.cfg, op)
        await tb.check_instruction(inst, regs, vector_state(rng, tb.cfg, op), label=f"#{index}")
    tb.save_records(args.get("record"))


def abuf(address: int) -> Operand:
    return Operand(Space.ABUF, 0, address)


def imm(value: float) -> Operand:
    return Operand(Space.IMM, 0, int(nx.fp16_bits(np.float16(value))))


def layernorm_and_softmax(rows: int, d: int, t: int, align: int) -> list:
    """A LayerNorm of `rows` x `d` and a softmax over `rows` x `t` scores, as host/compiler/build.py emits them: rows
    and blocks on `align`-word boundaries (the vector unit's rule), the row statistics one word a row anywhere."""
    X, Y, T, P, S, SC = (i * 8 * aligned_up(max(d, t), align) for i in range(6))   # input, output, scratch,
    sw = 4                                                                          # gamma|beta, stats, scores
    mean, var, rstd, rowmax, rowsum = (abuf(S + i) for i in range(5))
    dims = dict(rows=Dim(2, 0), n=Dim(0, d))
    rs = Flags(src2_row_scalar=1)
    ds, ts = aligned_up(d, align), aligned_up(t, align)
    ln = [
        Instruction.make(Opcode.VDOT, dst=mean, src1=abuf(X), src2=imm(1.0 / d), dst_stride=sw, src1_stride=ds, **dims),
        Instruction.make(Opcode.VSUB, dst=abuf(Y), src1=abuf(X), src2=mean, dst_stride=ds, src1_stride=ds,
                         src2_stride=sw, flags=rs, **dims),
        Instruction.make(Opcode.VMUL, dst=abuf(T), src1=abuf(Y), src2=imm(1.0 / d), dst_stride=ds, src1_stride=ds,
                         **dims),
        Instruction.make(Opcode.VDOT, dst=var, src1=abuf(T), src2=abuf(Y), dst_stride=sw, src1_stride=ds,
                         src2_stride=ds, **dims),
        Instruction.make(Opcode.VADD, dst=var, src1=var, src2=imm(1e-5), rows=Dim(2, 0), n=Dim(0, 1), dst_stride=sw,
                         src1_stride=sw),
        Instruction.make(Opcode.VRSQRT, dst=rstd, src1=var, rows=Dim(2, 0), n=Dim(0, 1), dst_stride=sw, src1_stride=sw),
        Instruction.make(Opcode.VMUL, dst=abuf(Y), src1=abuf(Y), src2=rstd, dst_stride=ds, src1_stride=ds,
                         src2_stride=sw, flags=rs, **dims),
        Instruction.make(Opcode.VSCALE_SHIFT, dst=abuf(Y), src1=abuf(Y), src2=abuf(P), aux=abuf(P + ds),
                         dst_stride=ds, src1_stride=ds, **dims),
    ]
    sdims = dict(rows=Dim(2, 0), n=Dim(0, t), dst_stride=ts, src1_stride=ts)
    softmax = [
        Instruction.make(Opcode.VMAX, dst=rowmax, src1=abuf(SC), rows=Dim(2, 0), n=Dim(0, t), dst_stride=sw,
                         src1_stride=ts),
        Instruction.make(Opcode.VSUB, dst=abuf(SC), src1=abuf(SC), src2=rowmax, src2_stride=sw, flags=rs, **sdims),
        Instruction.make(Opcode.VEXP, dst=abuf(SC), src1=abuf(SC), **sdims),
        Instruction.make(Opcode.VSUM, dst=rowsum, src1=abuf(SC), rows=Dim(2, 0), n=Dim(0, t), dst_stride=sw,
                         src1_stride=ts),
        Instruction.make(Opcode.VRECIP, dst=rowsum, src1=rowsum, rows=Dim(2, 0), n=Dim(0, 1), dst_stride=sw,
                         src1_stride=sw),
        Instruction.make(Opcode.VMUL, dst=abuf(SC), src1=abuf(SC), src2=rowsum, src2_stride=sw, flags=rs, **sdims),
    ]
    return ln + softmax


@cocotb.test()
async def layernorm_and_softmax_sequences(dut):
    """Dependent instructions on the RTL's own results (loaded once): the end state equals the
    functional simulator's after the same sequence, and every step's state along the way; then the same
    sequence issued back to back (each instruction taken as soon as the unit is ready)."""
    tb = DatapathTB(dut)
    await tb.start()
    rng = np.random.default_rng(21)
    for rows, d, t in ((1, 37, 13), (3, 24, 9), (6, 40, 27)):
        state = {Space.ABUF: fp16_data(rng, tb.cfg.abuf_words, scale=3.0, specials=0.0),
                 Space.WBUF: fp16_data(rng, tb.cfg.wbuf_words)}
        regs = [0] * 16
        regs[2] = rows
        expected = state
        for inst in layernorm_and_softmax(rows, d, t, tb.cfg.vector_align):
            await tb.check_instruction(inst, regs, expected, label="sequence")
            expected = golden(tb.cfg, expected, inst, regs)
        got = await tb.dump()
        assert all((got[s] == expected[s]).all() for s in got), "sequence end state differs"
        await tb.check_back_to_back(layernorm_and_softmax(rows, d, t, tb.cfg.vector_align), regs, state,
                                    label="back to back")
    tb.save_records(bench.args().get("record"))


@cocotb.test()
async def bad_instructions_raise_errors(dut):
    tb = DatapathTB(dut)
    await tb.start()
    rng = np.random.default_rng(12)
    cfg = tb.cfg
    cases = []
    for op in (Opcode.VADD, Opcode.VSCALE_SHIFT, Opcode.VSUM, Opcode.VEXP):
        inst, regs = vector_case(rng, cfg, op)
        word = inst.encode()
        cases += [
            ("reserved bit", inst, regs, set_field(word, "reserved", 1 << int(rng.integers(90))), ErrorCode.RESERVED),
            ("unused k", inst, regs, set_field(word, "k.imm", 5), ErrorCode.RESERVED),
            ("src1 in WBUF", inst, regs, set_field(word, "src1.space", Space.WBUF.value), ErrorCode.BAD_SPACE),
            ("n 0: a no-op", decode(set_field(set_field(word, "n.reg", 0), "n.imm", 0)), regs, None, ErrorCode.NONE),
            ("dst past ABUF", inst, regs, set_field(set_field(word, "dst.reg", 0), "dst.offset", cfg.abuf_words),
             ErrorCode.OUT_OF_RANGE),
            ("src1 past 2**32", inst, regs, set_field(set_field(word, "src1.reg", 0), "src1.offset",
                                                      (1 << 32) - cfg.vector_align), ErrorCode.OUT_OF_RANGE),
        ]
    inst, regs = vector_case(rng, cfg, Opcode.VSUM)
    cases.append(("row-scalar flag on VSUM", inst, regs, set_field(inst.encode(), "flags.src2_row_scalar", 1),
                  ErrorCode.RESERVED))
    mm = Instruction.make(Opcode.MATMUL, dst=abuf(0), src1=abuf(0), src2=Operand(Space.WBUF), rows=Dim(0, 1),
                          n=Dim(0, 1), k=Dim(0, 1))
    cases.append(("MATMUL to the vector unit", mm, [0] * 16, mm.encode(), ErrorCode.WRONG_UNIT))
    A, V = cfg.vector_align, cfg.vector_width       # the alignment rule (hw/resolved.misaligned_vector)
    two = dict(rows=Dim(0, 2), n=Dim(0, V), dst_stride=V)
    for label, inst, code in (
            ("src1 off its boundary", Instruction.make(Opcode.VADD, dst=abuf(0), src1=abuf(2 * A + 1),
                                                       src2=abuf(4 * A), src1_stride=A, src2_stride=A, **two),
             ErrorCode.MISALIGNED),
            ("src2's row stride off", Instruction.make(Opcode.VMUL, dst=abuf(0), src1=abuf(2 * A), src2=abuf(4 * A),
                                                       src1_stride=A, src2_stride=A + 1, **two), ErrorCode.MISALIGNED),
            ("aux off its boundary", Instruction.make(Opcode.VSCALE_SHIFT, dst=abuf(0), src1=abuf(2 * A),
                                                      src2=imm(2.0), aux=abuf(6 * A - 1), src1_stride=A, **two),
             ErrorCode.MISALIGNED),
            ("a row scalar anywhere", Instruction.make(Opcode.VSUB, dst=abuf(0), src1=abuf(2 * A), src2=abuf(6 * A - 1),
                                                       src1_stride=A, src2_stride=3, flags=Flags(src2_row_scalar=1),
                                                       **two), ErrorCode.NONE),
            ("one word a row anywhere", Instruction.make(Opcode.VRSQRT, dst=abuf(0), src1=abuf(2 * A + 3),
                                                         rows=Dim(0, 3), n=Dim(0, 1), dst_stride=1, src1_stride=5),
             ErrorCode.NONE)):
        refused = misaligned_vector(resolved_of(inst, [0] * 16), A) is not None
        assert refused == (code is ErrorCode.MISALIGNED), f"{label}: the shared rule says {refused}"
        cases.append((label, inst, [0] * 16, None if code is ErrorCode.NONE else inst.encode(), code))
    for label, inst, regs, word, code in cases:
        await tb.check_instruction(inst, regs, random_state(rng, cfg), label=label, word=word, error=code)
    inst, regs = vector_case(rng, cfg, Opcode.VDOT)
    await tb.check_instruction(inst, regs, random_state(rng, cfg), label="after errors")


@cocotb.test()
async def full_rate(dut):
    """One chunk of vector_width elements per cycle (a special function's step: special_lanes elements): busy
    cycles = overhead + rows * steps + stalls + latency (VSUM/VDOT with rows >= loop_latency; a single row's sum
    takes loop_latency cycles per chunk), the stalls
    those of the operands' chunks in one buffer memory: none for operands in distinct memories, one a chunk
    for src2 a whole period of the memories (chunk x banks words) from src1, also as a row scalar's chunk."""
    tb = DatapathTB(dut)
    tb.issue_probability = 1.0        # the full-rate case: valid never low
    await tb.start()
    unit, cfg = tb.top.unit, tb.cfg
    V = cfg.vector_width
    period = banks.period(cfg.buffer_chunk_words, cfg.buffer_banks)
    rng = np.random.default_rng(6)
    wrong = []
    for op, rows, n, src2, stalls in ((Opcode.VADD, 1, 7 * V, 1024, 0), (Opcode.VEXP, 3, 2 * V + 1, None, 0),
                                      (Opcode.VGELU, 2, V + 3, None, 0),
                                      (Opcode.VMAX, 2, 3 * V, None, 0), (Opcode.VSUM, 5, 4 * V, None, 0),
                                      (Opcode.VDOT, 12, 2 * V - 1, 1024, None), (Opcode.VSUM, 1, 4 * V, None, 0),
                                      (Opcode.VADD, 2, 3 * V, 512 + 13 * period, 2 * 3),
                                      (Opcode.VSUB, 2, 3 * V, 512 + 13 * period, 2)):
        stride = aligned_up(n, cfg.vector_align)
        fields = dict(dst=abuf(0), src1=abuf(512), rows=Dim(0, rows), n=Dim(0, n), dst_stride=n, src1_stride=stride)
        if src2 is not None:
            scalar = op is Opcode.VSUB
            fields.update(src2=abuf(src2), src2_stride=stride, flags=Flags(src2_row_scalar=int(scalar)))
        inst = Instruction.make(op, **fields)
        step = unit.step_words(op)
        modeled = vector_stall_cycles(rows, n, vector_operands(resolved_of(inst, [0] * 16), cfg), cfg, step)
        if stalls is not None and modeled != stalls:
            wrong.append(f"{inst}: the model counts {modeled} stalls, by hand {stalls}")
        cycles = await tb.check_instruction(inst, [0] * 16, random_state(rng, cfg), label="full rate")
        chunks = -(-n // step)
        issue = rows * chunks
        if op in (Opcode.VSUM, Opcode.VDOT) and rows < unit.loop_latency:
            issue = (chunks - 1) * unit.loop_latency + rows
        expected = unit.overhead + issue + modeled + unit.latency_of(op)
        if cycles != expected:
            wrong.append(f"{inst}: {cycles} busy cycles, expected {expected}")
    tb.save_records(bench.args().get("record"))
    assert not wrong, "\n".join(wrong)


@cocotb.test()
async def contended_instructions_bit_exact(dut):
    """Random instructions while other readers take ABUF's memories in half the cycles (the harness's `contend`
    port, as the matrix unit and the DMA do in the core): bit-exact, and the unit waited."""
    args = bench.args()
    tb = DatapathTB(dut)
    await tb.start()
    rng = np.random.default_rng(args["seed"] + 1)
    cases = []
    for index in range(max(4, args["instructions"] // 5)):
        op = VECTOR_OPS[(3 * index) % len(VECTOR_OPS)]
        cases.append((*vector_case(rng, tb.cfg, op), vector_state(rng, tb.cfg, op)))
    await tb.check_contended(cases)
