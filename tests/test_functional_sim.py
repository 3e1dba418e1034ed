"""The functional simulator: every opcode's result against hw/numerics.py on random data through small
hand-written programs, the ring (ALLGATHER, SEND/RECV) on several cards, and every error report."""
import dataclasses
import gc

import numpy as np
import pytest

from ringgpt.host.device import (AddressFault, AlignmentFault, CollectiveMismatchError, DeviceError, HostAccessError,
                                 IllegalInstructionFault, NotLoadedError, RingDeadlockError)
from ringgpt.host.image import ApplianceImage, CardImage, ImageError
from ringgpt.hw import numerics as nm
from ringgpt.hw.config import ConfigMismatchError, get_config
from ringgpt.hw.isa import Opcode, Space
from ringgpt.hw.assembly import assemble
from ringgpt.hw.program import Program
from ringgpt.sim.functional import SimulatorDevice, StepLimitError

CFG = get_config("sim-small")  # mac_width 8, vector_width 8
HBM_WORDS = 4096
HOST_WORDS = 1024


def device_for(texts, cfg=CFG, hbm=(), hbm_words=HBM_WORDS, host_words=HOST_WORDS, **kwargs) -> SimulatorDevice:
    """A loaded device running one assembly text per card; hbm: (card, address, array) triples."""
    texts = [texts] if isinstance(texts, str) else texts
    cfg = cfg.with_cards(len(texts))
    cards = [CardImage(Program(assemble(t), cfg.name, cfg.hash, i, cfg.cards),
                       [(a, arr) for c, a, arr in hbm if c == i], hbm_words, host_words) for i, t in enumerate(texts)]
    device = SimulatorDevice(cfg, **kwargs)
    device.load(ApplianceImage(cfg, cards))
    return device


def rand16(rng, *shape, scale=2.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def bits(a) -> np.ndarray:
    return np.asarray(a, np.float16).view(np.uint16)


def block(device, space, base, rows, n, stride, card=0) -> np.ndarray:
    mem = device.memory(card, space)
    return np.array([mem[base + r * stride:base + r * stride + n] for r in range(rows)])


def put(device, space, base, values, stride=None, card=0):
    """Writes a 2-D block straight into a card's memory (test set-up)."""
    values = np.atleast_2d(values)
    stride = values.shape[1] if stride is None else stride
    mem = device.cards[card].mem[space]
    for r, row in enumerate(values):
        mem[base + r * stride:base + r * stride + row.size] = row


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# --- control and data movement ------------------------------------------------------------------

def test_control_ops_wrap_and_r0_stays_zero():
    device = device_for("""
        SETI rd=r3 imm=-5
        ADDI rd=r4 rs=r3 imm=7
        MULI rd=r5 rs=r1 imm=-3
        ADD rd=r6 rs=r1 rt=r2
        SETI rd=r0 imm=99
        MULI rd=r7 rs=r6 imm=0x10000
        MULI rd=r7 rs=r7 imm=0x10000
        HALT""")
    device.run(pos=11, rows=4)
    regs = device.cards[0].regs
    assert regs[:8] == [0, 11, 4, 0xFFFFFFFB, 2, (-33) & 0xFFFFFFFF, 15, 0]


def test_load_store_strided_register_relative_and_transpose(rng):
    # off-chip LOADs keep each word's offset within the 8-word beat (hw/resolved.misaligned_transfer): HBM rows of
    # 16 words to ABUF rows of 8 at a base 48 words on; STOREs and on-chip copies take any offsets
    data = rand16(rng, 6, 16)
    device = device_for("""
        MULI rd=r3 rs=r1 imm=16
        LOAD dst=ABUF[96] src1=HBM[48+r3] rows=3 n=7 dst_stride=8 src1_stride=16
        LOAD dst=WBUF[200] src1=ABUF[96] rows=3 n=7 dst_stride=3 src1_stride=8 +transpose
        STORE dst=HOST[40+r2] src1=ABUF[96] rows=r2 n=7 dst_stride=9 src1_stride=8
        STORE dst=HBM[1000] src1=ABUF[96] rows=3 n=7 dst_stride=5 src1_stride=8 +transpose
        LOAD dst=ABUF[299] src1=HOST[40+r2] rows=2 n=4 dst_stride=9 src1_stride=9
        HALT""", hbm=[(0, 48, data.ravel())])
    device.run(pos=2, rows=3)  # r3 = 32: rows 2..4 of data
    want = data[2:5, :7]
    assert np.array_equal(bits(block(device, Space.ABUF, 96, 3, 7, 8)), bits(want))
    assert np.array_equal(bits(block(device, Space.WBUF, 200, 7, 3, 3)), bits(want.T))
    assert np.array_equal(bits(block(device, Space.HOST, 43, 3, 7, 9)), bits(want))
    assert np.array_equal(bits(device.read_host(0, 43, 7)), bits(want[0]))
    assert np.array_equal(bits(block(device, Space.HBM, 1000, 7, 3, 5)), bits(want.T))
    assert np.array_equal(bits(block(device, Space.ABUF, 299, 2, 4, 9)), bits(want[:2, :4]))


@pytest.mark.parametrize("text", [
    "LOAD dst=ABUF[97] src1=HBM[48] rows=1 n=7",
    "LOAD dst=ABUF[96] src1=HBM[48] rows=2 n=7 dst_stride=8 src1_stride=12",
    "GATHER dst=ABUF[0] src1=HBM[8] src2=HOST[0] rows=1 n=4 src1_stride=12",
    "GATHER dst=ABUF[0] src1=HBM[8] src2=HOST[0] rows=2 n=4 dst_stride=4 src1_stride=16",
])
def test_offchip_reads_off_the_beat_are_refused(text):
    """A LOAD's or GATHER's HBM/host words at other offsets within the beat than their ABUF words: AlignmentFault,
    nothing written (the RTL's MISALIGNED)."""
    device = device_for("NOP\n" + text + "\nHALT")
    with pytest.raises(AlignmentFault, match="8-word beat") as info:
        device.run(pos=0, rows=1)
    assert (info.value.card, info.value.pc) == (0, 1)
    assert not device.memory(0, Space.ABUF)[:200].any()


def test_gather_reads_uint16_indices_from_host_and_abuf(rng):
    table = rand16(rng, 255, 16)
    device = device_for("""
        GATHER dst=ABUF[0] src1=HBM[8] src2=HOST[0] rows=3 n=12 dst_stride=16 src1_stride=16
        LOAD dst=ABUF[496] src1=HOST[0] rows=1 n=3
        GATHER dst=ABUF[97] src1=HBM[9] src2=ABUF[496] rows=3 n=5 dst_stride=8 src1_stride=16
        HALT""", hbm=[(0, 8, table.ravel())])
    device.write_host(0, 0, [254, 0, 201])  # integers are bit patterns, not FP16 values
    device.run(0, 3)
    assert np.array_equal(bits(block(device, Space.ABUF, 0, 3, 12, 16)), bits(table[[254, 0, 201], :12]))
    assert np.array_equal(bits(block(device, Space.ABUF, 97, 3, 5, 8)), bits(table[[254, 0, 201], 1:6]))


# --- matrix unit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("k,n,gelu,bias_at", [(13, 5, False, None), (24, 9, True, 3000), (70, 3, False, 5000)])
def test_matmul_equals_numerics(rng, k, n, gelu, bias_at):
    rows = 3
    x, w_cols, bias = rand16(rng, rows, k), rand16(rng, n, k, scale=0.5), rand16(rng, n)
    aux = f"aux=WBUF[{bias_at}]" if bias_at else ""
    stride = -(-(k + 1) // CFG.weight_align) * CFG.weight_align      # WBUF weights on tile boundaries
    device = device_for(f"""
        MATMUL dst=ABUF[2000+r1] src1=ABUF[10] src2=WBUF[96] {aux} rows=r2 n={n} k={k} dst_stride=20
               src1_stride={k + 3} src2_stride={stride} {'+gelu' if gelu else ''}
        HALT""".replace("\n               ", " "))
    put(device, Space.ABUF, 10, x, k + 3)
    put(device, Space.WBUF, 96, w_cols, stride)
    if bias_at:
        put(device, Space.WBUF, bias_at, bias)
    device.run(pos=7, rows=rows)
    want = nm.matmul(x, w_cols.T, CFG.mac_width, bias if bias_at else None, gelu)
    assert np.array_equal(bits(block(device, Space.ABUF, 2007, rows, n, 20)), bits(want))


def test_masked_qk_masks_future_positions_and_writes_row_max(rng):
    rows, n, k, pos = 3, 9, 16, 4
    q, keys = rand16(rng, rows, k), rand16(rng, n, k)
    device = device_for(f"""
        MASKED_QK dst=ABUF[500] src1=ABUF[0] src2=WBUF[104] aux=ABUF[900] rows=r2 n={n} k={k} pos=r1
                  dst_stride=12 src1_stride={k} src2_stride={k} aux_stride=2
        HALT""".replace("\n                  ", " "))
    put(device, Space.ABUF, 0, q)
    put(device, Space.WBUF, 104, keys)
    device.run(pos=pos, rows=rows)
    want = nm.matmul(q, keys.T, CFG.mac_width)
    for r in range(rows):
        want[r, pos + r + 1:] = -np.inf
    got = block(device, Space.ABUF, 500, rows, n, 12)
    assert np.array_equal(bits(got), bits(want))
    assert bits(got)[0, -1] == nm.FP16_NEG_INF
    assert np.array_equal(bits(block(device, Space.ABUF, 900, rows, 1, 2))[:, 0], bits(nm.reduce_max(want, axis=1)))


# --- vector unit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", [Opcode.VADD, Opcode.VSUB, Opcode.VMUL])
@pytest.mark.parametrize("mode", ["element", "row_scalar", "imm"])
def test_vector_binary(rng, op, mode):
    rows, n = 3, 19
    a, b = rand16(rng, rows, n), rand16(rng, rows, 24)
    src2 = {"element": "src2=ABUF[200] src2_stride=24", "row_scalar": "src2=ABUF[200] src2_stride=24 +src2_row_scalar",
            "imm": "src2=IMM[0xc100]"}[mode]
    device = device_for(f"""
        {op.name} dst=ABUF[400] src1=ABUF[0] {src2} rows={rows} n={n} dst_stride=21 src1_stride=24
        HALT""")
    put(device, Space.ABUF, 0, a, 24)
    put(device, Space.ABUF, 200, b, 24)
    device.run(0, 1)
    operand = {"element": b[:, :n], "row_scalar": b[:, :1], "imm": np.float16(-2.5)}[mode]
    want = {Opcode.VADD: nm.vadd, Opcode.VSUB: nm.vsub, Opcode.VMUL: nm.vmul}[op](a, operand)
    assert np.array_equal(bits(block(device, Space.ABUF, 400, rows, n, 21)), bits(want))


@pytest.mark.parametrize("src2_mode,aux_mode", [("element", "element"), ("row_scalar", "imm"), ("imm", "row_scalar")])
def test_vscale_shift(rng, src2_mode, aux_mode):
    rows, n, stride = 4, 10, 16         # rows on the vector unit's 8-word boundaries
    a, b, c = rand16(rng, rows, n), rand16(rng, rows, n), rand16(rng, rows, n)

    def operand(name, mode, base):
        return {"element": f"{name}=ABUF[{base}] {name}_stride={stride}",
                "row_scalar": f"{name}=ABUF[{base + 3}] {name}_stride={stride} +{name}_row_scalar",
                "imm": f"{name}=IMM[0x3800]"}[mode]
    device = device_for(f"VSCALE_SHIFT dst=ABUF[600] src1=ABUF[0] {operand('src2', src2_mode, 96)} "
                        f"{operand('aux', aux_mode, 296)} rows={rows} n={n} dst_stride={n} src1_stride={stride}\nHALT")
    for base, values in ((0, a), (96, b), (296, c)):
        put(device, Space.ABUF, base, values, stride)
    for name, mode, base, values in (("src2", src2_mode, 96, b), ("aux", aux_mode, 296, c)):
        if mode == "row_scalar":         # a row scalar's word may lie anywhere
            put(device, Space.ABUF, base + 3, values[:, :1], stride)
    device.run(0, 1)
    pick = {"element": lambda v: v, "row_scalar": lambda v: v[:, :1], "imm": lambda v: np.float16(0.5)}
    want = nm.vscale_shift(a, pick[src2_mode](b), pick[aux_mode](c))
    assert np.array_equal(bits(block(device, Space.ABUF, 600, rows, n, n)), bits(want))


@pytest.mark.parametrize("op,name", [(Opcode.VEXP, "exp"), (Opcode.VRECIP, "recip"), (Opcode.VRSQRT, "rsqrt"),
                                     (Opcode.VGELU, "gelu")])
def test_vector_special(rng, op, name):
    a = rand16(rng, 2, 30)
    a[0, :4] = [0.0, -0.0, np.inf, np.nan]
    device = device_for(f"{op.name} dst=ABUF[100] src1=ABUF[0] rows=2 n=30 dst_stride=32 src1_stride=32\nHALT")
    put(device, Space.ABUF, 0, a, 32)
    device.run(0, 1)
    assert np.array_equal(bits(block(device, Space.ABUF, 100, 2, 30, 32)), bits(nm.special(name, a)))


def test_vector_reductions(rng):
    rows, n, s = 3, 37, 40
    a, b = rand16(rng, rows, n), rand16(rng, rows, n)
    a[1, 5] = np.nan
    device = device_for(f"""
        VSUM dst=ABUF[500] src1=ABUF[0] rows={rows} n={n} dst_stride=2 src1_stride={s}
        VDOT dst=ABUF[510] src1=ABUF[0] src2=ABUF[200] rows={rows} n={n} dst_stride=1 src1_stride={s} src2_stride={s}
        VDOT dst=ABUF[520] src1=ABUF[0] src2=IMM[0x4000] rows={rows} n={n} dst_stride=1 src1_stride={s}
        VMAX dst=ABUF[530] src1=ABUF[0] rows={rows} n={n} dst_stride=3 src1_stride={s}
        HALT""")
    put(device, Space.ABUF, 0, a, s)
    put(device, Space.ABUF, 200, b, s)
    device.run(0, 1)
    vw = CFG.vector_width
    assert np.array_equal(bits(block(device, Space.ABUF, 500, rows, 1, 2))[:, 0],
                          [bits(nm.reduce_sum(a[r], vw)) for r in range(rows)])
    assert np.array_equal(bits(block(device, Space.ABUF, 510, rows, 1, 1))[:, 0],
                          [bits(nm.reduce_sum(a[r], vw, b[r])) for r in range(rows)])
    assert np.array_equal(bits(block(device, Space.ABUF, 520, rows, 1, 1))[:, 0],
                          [bits(nm.reduce_sum(a[r], vw, np.full(n, 2.0, np.float16))) for r in range(rows)])
    assert np.array_equal(bits(block(device, Space.ABUF, 530, rows, 1, 3))[:, 0], bits(nm.reduce_max(a, axis=1)))


def test_zero_sized_operations_touch_nothing():
    device = device_for("VSUM dst=ABUF[0] src1=ABUF[8] rows=r2 n=5\n"
                        "LOAD dst=ABUF[0] src1=HBM[999999] rows=2 n=r2\nHALT")
    device.cards[0].mem[Space.ABUF][0] = 7.0
    device.run(0, 0)
    assert device.memory(0, Space.ABUF)[0] == 7.0


# --- the ring ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("widths", [(5, 3, 4), (2, 7, 1, 4)])
def test_allgather_uneven_slices(rng, widths):
    cards, rows = len(widths), 2
    offsets = np.concatenate([[0], np.cumsum(widths)[:-1]])
    total = sum(widths)
    texts = [f"ALLGATHER dst=ABUF[{100 + 7 * c}] src1=ABUF[{10 * c}] rows=r2 n={n} k={k} "
             f"dst_stride={total + c} src1_stride=9\nHALT" for c, (n, k) in enumerate(zip(widths, offsets))]
    device = device_for(texts)
    slices = [rand16(rng, rows, n) for n in widths]
    for c, values in enumerate(slices):
        put(device, Space.ABUF, 10 * c, values, 9, card=c)
    device.run(0, rows)
    want = np.concatenate(slices, axis=1)
    for c in range(cards):
        assert np.array_equal(bits(block(device, Space.ABUF, 100 + 7 * c, rows, total, total + c, card=c)), bits(want))
    report = device.last_report
    assert all(card.busy["ROUTER"] > 0 for card in report.cards)


def test_allgather_resolution_is_reused_while_it_is_unchanged():
    """An ALLGATHER's Resolved (with every card's slices) is the same object in the next run while its value is
    unchanged (the cycle model remembers costs by object), and a new one when a card's slice changes."""
    texts = [f"ALLGATHER dst=ABUF[100] src1=ABUF[{10 * c}] rows=1 n=r2 k={4 * c} dst_stride=8 src1_stride=4\nHALT"
             for c in range(2)]
    device = device_for(texts)
    gathered = []
    for rows in (2, 2, 3):
        device.run(0, rows)
        gathered.append([card.trace[0] for card in device.cards])
    assert all(now is before for now, before in zip(gathered[1], gathered[0]))
    assert [r.slices for r in gathered[2]] == [((3, 0), (3, 4))] * 2
    assert not any(now is before for now, before in zip(gathered[2], gathered[1]))


def test_send_recv_around_the_ring_and_to_itself(rng):
    data = [rand16(rng, 2, 6) for _ in range(3)]
    texts = ["SEND src1=ABUF[0] rows=2 n=6 src1_stride=8\nRECV dst=ABUF[100] rows=2 n=6 dst_stride=6\nHALT"] * 3
    device = device_for(texts)
    for c in range(3):
        put(device, Space.ABUF, 0, data[c], 8, card=c)
    device.run(0, 1)
    for c in range(3):
        assert np.array_equal(bits(block(device, Space.ABUF, 100, 2, 6, 6, card=c)), bits(data[(c - 1) % 3]))
    single = device_for("SEND src1=ABUF[0] rows=1 n=4\nSEND src1=ABUF[4] rows=1 n=4\n"
                        "RECV dst=ABUF[20] rows=1 n=4\nRECV dst=ABUF[24] rows=1 n=4\nHALT")
    put(single, Space.ABUF, 0, np.arange(8, dtype=np.float16))
    single.run(0, 1)
    assert np.array_equal(single.memory(0, Space.ABUF)[20:28], np.arange(8))


def test_column_parallel_matmul_on_four_cards_equals_one_card(rng):
    """Each card computes its columns of x @ W and the ring gathers them: bit-identical to one card."""
    k, n_total, widths = 40, 22, (6, 6, 5, 5)
    x, w_cols = rand16(rng, 2, k), rand16(rng, n_total, k, scale=0.3)
    offsets = np.concatenate([[0], np.cumsum(widths)[:-1]])
    texts, hbm = [], []
    for c, (n, off) in enumerate(zip(widths, offsets)):
        matmul = (f"MATMUL dst=ABUF[200] src1=ABUF[0] src2=WBUF[0] rows=r2 n={n} k={k} dst_stride={n} "
                  f"src1_stride={k} src2_stride={k}")
        texts.append(f"""
            LOAD dst=ABUF[0] src1=HOST[0] rows=r2 n={k} dst_stride={k} src1_stride={k}
            LOAD dst=WBUF[0] src1=HBM[0] rows=1 n={n * k}
            {matmul}
            ALLGATHER dst=ABUF[400] src1=ABUF[200] rows=r2 n={n} k={off} dst_stride=24 src1_stride={n}
            VGELU dst=ABUF[400] src1=ABUF[400] rows=r2 n={n_total} dst_stride=24 src1_stride=24
            STORE dst=HOST[100] src1=ABUF[400] rows=r2 n={n_total} dst_stride={n_total} src1_stride=24
            HALT""")
        hbm.append((c, 0, w_cols[off:off + n].ravel()))
    device = device_for(texts, hbm=hbm)
    for c in range(4):
        device.write_host(c, 0, x.ravel())
    device.run(0, 2)
    want = nm.special("gelu", nm.matmul(x, w_cols.T, CFG.mac_width))
    for c in range(4):
        assert np.array_equal(bits(device.read_host(c, 100, 2 * n_total)), bits(want.ravel()))


# --- device behaviour --------------------------------------------------------------------------------

def test_runs_keep_memory_reset_registers_and_report_stats(tmp_path):
    text = "LOAD dst=ABUF[0+r1] src1=HOST[0+r1] rows=1 n=1\nADDI rd=r5 rs=r5 imm=1\nHALT"
    device = device_for(text)
    device.write_host(0, 0, np.array([3.0] * 3, np.float16))
    stats = [device.run(pos, 1) for pos in range(3)]
    assert list(device.memory(0, Space.ABUF)[:3]) == [3.0, 3.0, 3.0]
    assert device.cards[0].regs[5] == 1
    report = device.last_report
    assert stats[-1].cycles == report.cycles > 0
    assert stats[-1].seconds == pytest.approx(report.cycles / (CFG.clock_mhz * 1e6) + CFG.launch_overhead_us * 1e-6)
    assert stats[-1].breakdown == report.cards[0].classes and stats[-1].wall_seconds > 0
    # the host time of the three runs, split into executing the programs and the cycle model
    assert 0 < device.seconds["functional"] and 0 < device.seconds["cycle_model"]
    assert sum(device.seconds.values()) <= sum(s.wall_seconds for s in stats)
    status = device.status()
    assert (status.loaded, status.runs, status.cards, status.last_error) == (True, 3, 1, None)
    # The same image through a directory and raw binary words.
    cfg = CFG.with_cards(1)
    words = [inst.encode() for inst in assemble(text)]
    image = ApplianceImage(cfg, [CardImage(Program(assemble(text), cfg.name, cfg.hash), [], 16, 4)])
    image.save(tmp_path / "img")
    for source in (tmp_path / "img", ApplianceImage(cfg, [CardImage(Program(words, cfg.name, cfg.hash), [], 16, 4)])):
        other = SimulatorDevice(cfg)
        other.load(source)
        other.write_host(0, 2, np.array([5.0], np.float16))
        other.run(2, 1)
        assert other.memory(0, Space.ABUF)[2] == 5.0
    device.close()
    assert not device.status().loaded


# --- errors ------------------------------------------------------------------------------------------

def test_illegal_word_in_a_raw_program_names_card_and_pc():
    cfg = CFG.with_cards(2)
    good = [inst.encode() for inst in assemble("NOP\nHALT")]
    bad = good[:1] + [0x3F] + good[1:]  # opcode 0x3F does not exist
    cards = [CardImage(Program(good, cfg.name, cfg.hash, 0, 2), [], 0, 0),
             CardImage(Program(bad, cfg.name, cfg.hash, 1, 2), [], 0, 0)]
    with pytest.raises(IllegalInstructionFault, match=r"card 1 pc 1 \(0x3f\): .*opcode") as info:
        SimulatorDevice(cfg).load(ApplianceImage(cfg, cards))
    assert (info.value.card, info.value.pc) == (1, 1)
    reserved = assemble("NOP")[0]._replace(reserved=1).encode()
    cards[1] = CardImage(Program([reserved] + good, cfg.name, cfg.hash, 1, 2), [], 0, 0)
    with pytest.raises(IllegalInstructionFault, match="card 1 pc 0 .*reserved"):
        SimulatorDevice(cfg).load(ApplianceImage(cfg, cards))


def test_program_without_halt_is_rejected():
    with pytest.raises(IllegalInstructionFault, match="card 0 pc 1 .*no HALT"):
        device_for("NOP")


@pytest.mark.parametrize("text,match", [
    ("LOAD dst=ABUF[262140] src1=HOST[4] rows=1 n=8",
     r"card 0 pc 1 \(LOAD dst=ABUF\[262140\] .*\): dst writes ABUF words \[262140, 262148\), beyond ABUF of 262144"),
    ("LOAD dst=WBUF[0] src1=HOST[0] rows=3 n=8 dst_stride=300000",
     r"dst writes WBUF words \[0, 600008\), beyond WBUF of 524288 words"),
    ("LOAD dst=ABUF[7] src1=HBM[4090+r1] rows=1 n=8",
     r"src1 reads HBM words \[4095, 4103\), beyond the image's HBM memory map of 4096 words"),
    ("STORE dst=HBM[4294967000] src1=ABUF[0] rows=1 n=8",
     r"dst writes HBM words \[4294967000, 4294967008\), beyond the card's HBM of 134217728 words"),
    ("STORE dst=HOST[1020] src1=ABUF[0] rows=1 n=8",
     r"dst writes HOST words \[1020, 1028\), beyond the host buffer of 1024"),
    ("GATHER dst=ABUF[0] src1=HBM[0] src2=HOST[0] rows=2 n=8 src1_stride=8",
     r"src1 \(index 600 of row 1\) reads HBM words \[4800, 4808\), beyond the image's HBM memory map"),
    ("VADD dst=ABUF[0] src1=ABUF[262104] src2=IMM[0x3c00] rows=r2 n=40 dst_stride=40 src1_stride=40",
     r"src1 reads ABUF words \[262104, 262184\)"),
])
def test_out_of_range_addresses_name_space_range_and_limit(text, match):
    device = device_for("NOP\n" + text + "\nHALT")
    device.write_host(0, 0, [3, 600])
    with pytest.raises(AddressFault, match=match) as info:
        device.run(pos=5, rows=2)
    assert (info.value.card, info.value.pc) == (0, 1)
    assert device.status().last_error == str(info.value)


def test_deadlock_report_names_every_card():
    texts = ["NOP\nALLGATHER dst=ABUF[0] src1=ABUF[100] rows=1 n=2 k=0\nHALT",
             "HALT",
             "NOP\nNOP\nRECV dst=ABUF[0] rows=1 n=2\nHALT"]
    device = device_for(texts)
    with pytest.raises(RingDeadlockError) as info:
        device.run(0, 1)
    message = str(info.value)
    assert "card 0 pc 1 (ALLGATHER dst=ABUF[0] src1=ABUF[100] rows=1 n=2): waits in ALLGATHER" in message
    assert "card 1 pc 0 (HALT): halted" in message
    assert "card 2 pc 2 (RECV dst=ABUF[0] rows=1 n=2): waits in RECV for a block from card 1" in message
    assert [c[:2] for c in info.value.cards] == [(0, 1), (1, 0), (2, 2)]


def test_collective_and_point_to_point_mismatches():
    gather = "ALLGATHER dst=ABUF[0] src1=ABUF[100] rows={rows} n=2 k={k}\nHALT"
    with pytest.raises(CollectiveMismatchError, match="different rows") as info:
        device_for([gather.format(rows=1, k=0), gather.format(rows=2, k=2)]).run(0, 1)
    assert "card 1 pc 0 (ALLGATHER" in str(info.value) and "rows=2 n=2 k=2" in str(info.value)
    with pytest.raises(CollectiveMismatchError, match="overlap"):
        device_for([gather.format(rows=1, k=0), gather.format(rows=1, k=1)]).run(0, 1)
    send = "SEND src1=ABUF[0] rows=1 n=4\nRECV dst=ABUF[8] rows=1 n={n}\nHALT"
    with pytest.raises(CollectiveMismatchError, match="does not match the SEND") as info:
        device_for([send.format(n=4), send.format(n=5)]).run(0, 1)
    assert "card 0 pc 0 (SEND src1=ABUF[0] rows=1 n=4): sent rows=1 n=4" in str(info.value)
    assert "card 1 pc 1 (RECV dst=ABUF[8] rows=1 n=5): expects rows=1 n=5" in str(info.value)
    with pytest.raises(CollectiveMismatchError, match="never received"):
        device_for(["SEND src1=ABUF[0] rows=1 n=4\nHALT", "HALT"]).run(0, 1)


def test_runs_pause_the_garbage_collector_and_restore_it():
    """A run pauses Python's cyclic garbage collector and restores it as it was, also when the run fails."""
    seen = []
    device = device_for("NOP\nHALT")
    assert gc.isenabled()
    device.run_watched(0, 1, {(0, 0): lambda card, pc, read: seen.append(gc.isenabled())})
    assert seen == [False] and gc.isenabled()
    with pytest.raises(StepLimitError):
        device_for("NOP\nHALT", max_steps=1).run(0, 1)
    assert gc.isenabled()
    gc.disable()
    try:
        device.run(0, 1)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_step_limit():
    device = device_for("NOP\nNOP\nNOP\nHALT", max_steps=3)
    with pytest.raises(StepLimitError, match=r"card 0 pc 3 \(HALT\): no HALT within the step limit of 3"):
        device.run(0, 1)


def test_config_mismatch_and_bad_images():
    other = dataclasses.replace(CFG, clock_mhz=123.0)
    program = Program(assemble("HALT"), other.name, other.hash)
    with pytest.raises(ConfigMismatchError, match="appliance image was built for config"):
        SimulatorDevice(CFG).load(ApplianceImage(other, [CardImage(program)]))
    with pytest.raises(ConfigMismatchError, match="card 0's program"):
        SimulatorDevice(CFG).load(ApplianceImage(CFG, [CardImage(program)]))
    good = Program(assemble("HALT"), CFG.name, CFG.hash)
    with pytest.raises(ImageError, match="has 2 cards"):
        SimulatorDevice(CFG).load(ApplianceImage(CFG, [CardImage(good)] * 2))
    with pytest.raises(ImageError, match="segment .* outside the memory map of 8 words"):
        SimulatorDevice(CFG).load(ApplianceImage(CFG, [CardImage(good, [(4, np.zeros(5, np.float16))], 8)]))
    with pytest.raises(ImageError, match="does not fit"):
        SimulatorDevice(CFG).load(ApplianceImage(CFG, [CardImage(good, [], CFG.hbm_words + 1)]))
    wrong_slot = Program(assemble("HALT"), CFG.name, CFG.hash, card=1, cards=2)
    with pytest.raises(ImageError, match="built for card 1 of 2"):
        SimulatorDevice(CFG).load(ApplianceImage(CFG, [CardImage(wrong_slot)]))


def test_host_side_misuse():
    device = SimulatorDevice(CFG)
    with pytest.raises(NotLoadedError):
        device.run(0, 1)
    with pytest.raises(NotLoadedError):
        device.write_host(0, 0, [1])
    device = device_for("HALT", host_words=8)
    with pytest.raises(HostAccessError, match=r"host buffer words \[6, 9\) lie outside its 8 words"):
        device.write_host(0, 6, np.zeros(3, np.float16))
    with pytest.raises(HostAccessError, match="card 1 does not exist"):
        device.read_host(1, 0, 1)
    with pytest.raises(HostAccessError, match="got float32"):
        device.write_host(0, 0, np.zeros(2, np.float32))
    with pytest.raises(HostAccessError, match="out of range"):
        device.write_host(0, 0, [70000])
    with pytest.raises(ValueError, match="pos must be an integer"):
        device.run(-1, 1)
    assert isinstance(HostAccessError("x"), DeviceError)


def test_bench_runs_a_compiled_model(capsys, load_script):
    """The speed benchmark (scripts/bench_simulator.py) end to end on a tiny compiled GPT-2 (prompt run, then
    decode runs)."""
    import json

    bench = load_script("bench_simulator")
    bench.main(["--model", "synthetic:n_layer=1,n_embd=32,n_head=2,vocab_size=300,n_positions=64",
                "--config", "sim-small", "--cards", "2", "--prompt", "3", "--tokens", "2", "--max-context", "16"])
    result = json.loads(capsys.readouterr().out)
    assert result["config"] == "sim-small-x2" and result["decode_tokens"] == 2
    assert result["modeled_decode"]["cycles"] > 0 and result["modeled_decode"]["busy"]["MATRIX"] > 0


# --- timing-only runs ----------------------------------------------------------------------------------

def _four_card_gather_program(k=40, n=6):
    return [f"""
        LOAD dst=ABUF[0] src1=HOST[0] rows=r2 n={k} dst_stride={k} src1_stride={k}
        LOAD dst=WBUF[0] src1=HBM[0] rows=1 n={n * k}
        MATMUL dst=ABUF[200] src1=ABUF[0] src2=WBUF[0] rows=r2 n={n} k={k} dst_stride={n} src1_stride={k} src2_stride={k}
        ALLGATHER dst=ABUF[400] src1=ABUF[200] rows=r2 n={n} k={c * n} dst_stride={4 * n} src1_stride={n}
        STORE dst=HOST[100] src1=ABUF[400] rows=r2 n={4 * n} dst_stride={4 * n} src1_stride={4 * n}
        HALT""" for c in range(4)]


def test_timing_only_run_models_the_same_schedule_without_data(rng):
    texts = _four_card_gather_program()
    hbm = [(c, 0, rand16(rng, 6 * 40)) for c in range(4)]
    full, timing = device_for(texts, hbm=hbm), device_for(texts, hbm=hbm, compute=False)
    for device in (full, timing):
        for c in range(4):
            device.write_host(c, 0, rand16(rng, 3 * 40))
    a, b = full.run(pos=2, rows=3), timing.run(pos=2, rows=3)
    assert (a.cycles, a.hbm_bytes, a.breakdown) == (b.cycles, b.hbm_bytes, b.breakdown)
    assert full.last_report.summary() == timing.last_report.summary()
    assert np.any(full.read_host(0, 100, 72) != 0)
    assert not np.any(timing.memory(0, Space.ABUF)) and not np.any(timing.memory(0, Space.HBM))


@pytest.mark.parametrize("compute", [True, False])
@pytest.mark.parametrize("src2, stride", [("[100]", 16), ("[96+r3]", 16), ("[96]", 12)])
def test_weights_off_tile_boundaries_fault(compute, src2, stride):
    """The matrix unit's alignment rule (hw/resolved.misaligned_weights; the RTL's ErrorCode.MISALIGNED): its
    weights (in WBUF) start on, and step by, multiples of weight_align words (8 at sim-small), in full and
    timing-only runs; aligned ones run."""
    space = "WBUF"
    def program(src2, stride):
        return (f"SETI rd=r3 imm=2\nMATMUL dst=ABUF[0] src1=ABUF[64] src2={space}{src2} rows=1 n=2 k=8 dst_stride=2 "
                f"src1_stride=8 src2_stride={stride}\nHALT")
    device = device_for(program(src2, stride), compute=compute)
    with pytest.raises(AlignmentFault, match=rf"{space} word .* not on 8-word boundaries") as info:
        device.run(0, 1)
    assert (info.value.card, info.value.pc) == (0, 1)
    device_for(program("[96+r3]", 16).replace("imm=2", "imm=8"), compute=compute).run(0, 1)
    device_for(program("[96]", 24), compute=compute).run(0, 1)


@pytest.mark.parametrize("compute", [True, False])
@pytest.mark.parametrize("cards", [1, 2])
@pytest.mark.parametrize("text, operand", [
    ("VADD dst=ABUF[200] src1=ABUF[4] src2=IMM[0x3c00] rows=1 n=8", "src1 at ABUF word 4"),
    ("VMUL dst=ABUF[200] src1=ABUF[0] src2=ABUF[64] rows=r3 n=9 src1_stride=16 src2_stride=12",
     "src2 at ABUF word 64 with row stride 12"),
    ("VSCALE_SHIFT dst=ABUF[200] src1=ABUF[0] src2=IMM[0x3c00] aux=ABUF[100] rows=1 n=8", "aux at ABUF word 100")])
def test_vector_operands_off_their_boundaries_fault(compute, cards, text, operand):
    """The vector unit's alignment rule (hw/resolved.misaligned_vector; the RTL's ErrorCode.MISALIGNED): with more
    than one word a row, its ABUF operands but row scalars start on, and step by, multiples of vector_align words (8
    at sim-small), in full and timing-only runs, on one card and in step on two (the cards' group plan); one word a
    row, or a row scalar, anywhere."""
    program = f"SETI rd=r3 imm=2\n{text}\nHALT"
    device = device_for([program] * cards, compute=compute)
    with pytest.raises(AlignmentFault, match=rf"its {operand} is not on 8-word boundaries") as info:
        device.run(0, 1)
    assert (info.value.card, info.value.pc) == (0, 1)
    fine = ("VADD dst=ABUF[200] src1=ABUF[5] src2=IMM[0x3c00] rows=r3 n=1 src1_stride=3\n"
            "VSUB dst=ABUF[300] src1=ABUF[8] src2=ABUF[77] rows=r3 n=9 src1_stride=16 src2_stride=5 +src2_row_scalar")
    device_for([f"SETI rd=r3 imm=2\n{fine}\nHALT"] * cards, compute=compute).run(0, 1)


def test_timing_only_run_still_checks_addresses():
    device = device_for("NOP\nLOAD dst=ABUF[2] src1=HBM[4090] rows=1 n=8\nHALT", compute=False)
    with pytest.raises(AddressFault, match=r"reads HBM words \[4090, 4098\), beyond the image's HBM memory map"):
        device.run(0, 1)


# --- watch points (run_watched, the hook of `ringgpt check`) -----------------------------------------------------
def test_run_watched_sees_memory_right_after_the_instruction():
    """Callbacks run after their instruction and before the next (the value is overwritten later), on the
    right card, including after an ALLGATHER (all blocks landed) and at HALT; memory and stats equal run()'s."""
    texts = [f"VADD dst=ABUF[0] src1=ABUF[0] src2=IMM[0x{0x4000 + 0x100 * c:04x}] rows=1 n=2\n"  # 0 + 2, 0 + 2.5
             "ALLGATHER dst=ABUF[8] src1=ABUF[0] rows=1 n=2 k=" + str(2 * c) + " dst_stride=4 src1_stride=2\n"
             "VADD dst=ABUF[0] src1=ABUF[0] src2=ABUF[0] rows=1 n=2\n"
             "HALT" for c in range(2)]
    seen = []

    def callback(card, pc, read):
        seen.append((card, pc, read(Space.ABUF, 0, 2).tolist(), read(Space.ABUF, 8, 4).tolist()))
    device = device_for(texts)
    stats = device.run_watched(0, 1, {(0, 0): callback, (1, 1): callback, (1, 2): callback, (0, 3): callback})
    assert sorted(seen) == [(0, 0, [2.0, 2.0], [0, 0, 0, 0]),
                            (0, 3, [4.0, 4.0], [2.0, 2.0, 2.5, 2.5]),
                            (1, 1, [2.5, 2.5], [2.0, 2.0, 2.5, 2.5]),
                            (1, 2, [5.0, 5.0], [2.0, 2.0, 2.5, 2.5])]
    plain = device_for(texts)
    assert plain.run(0, 1).cycles == stats.cycles
    for card in range(2):
        assert np.array_equal(bits(plain.memory(card, Space.ABUF)), bits(device.memory(card, Space.ABUF)))
    seen.clear()
    device.run(0, 1)  # the watch lasts one run
    assert seen == [] and all(card.watch is None for card in device.cards)
    assert device.supports_watch


def test_run_watched_rejects_pcs_outside_the_program():
    device = device_for("NOP\nHALT")
    with pytest.raises(ValueError, match="pc 2: the card's program has pc 0..1"):
        device.run_watched(0, 1, {(0, 2): lambda card, pc, read: None})
    with pytest.raises(HostAccessError, match="card 1 does not exist"):
        device.run_watched(0, 1, {(1, 0): lambda card, pc, read: None})


def test_deferred_weight_loads_behave_as_copies(rng):
    """Contiguous HBM -> WBUF LOADs are deferred (sim/functional/machine.py Card); every way of telling the
    difference sees the copy: an HBM STORE over the source after the LOAD, a second LOAD over part of the first,
    an on-chip write into the block, reads that span deferred and written words, and memory dumps."""
    hbm = rand16(rng, 600)
    program = """
        LOAD dst=ABUF[0] src1=HOST[0] rows=1 n=64
        LOAD dst=WBUF[0] src1=HBM[0] rows=4 n=64 dst_stride=64 src1_stride=64
        STORE dst=HBM[32] src1=ABUF[0] rows=1 n=64
        LOAD dst=WBUF[192] src1=HBM[400] rows=1 n=100
        LOAD dst=WBUF[10] src1=ABUF[0] rows=2 n=5 dst_stride=20 src1_stride=5
        MATMUL dst=ABUF[100] src1=ABUF[0] src2=WBUF[0] rows=1 n=4 k=16 src1_stride=64 src2_stride=16
        MATMUL dst=ABUF[500] src1=ABUF[0] src2=WBUF[200] rows=1 n=2 k=16 src1_stride=64 src2_stride=16
        HALT"""
    device = device_for(program, hbm=[(0, 0, hbm)])
    host = rand16(rng, 64)
    device.write_host(0, 0, host)
    device.run(0, 1)
    wbuf = np.zeros(CFG.wbuf_words, np.float16)
    wbuf[0:256] = hbm[0:256]                 # the first LOAD reads HBM before the STORE changes it
    wbuf[192:292] = hbm[400:500]             # the second LOAD supersedes words 192..255
    for r in range(2):
        wbuf[10 + 20 * r:15 + 20 * r] = host[5 * r:5 * r + 5]
    assert np.array_equal(bits(device.memory(0, Space.WBUF)), bits(wbuf))
    for at, base, n in ((100, 0, 4), (500, 200, 2)):  # a read across deferred and written words; one inside a block
        want = nm.matmul(host[None, :16], wbuf[base:base + 16 * n].reshape(n, 16).T, CFG.mac_width)
        assert np.array_equal(bits(block(device, Space.ABUF, at, 1, n, n)), bits(want))
    hbm_after = hbm.copy()
    hbm_after[32:96] = host
    assert np.array_equal(bits(device.memory(0, Space.HBM)[:600]), bits(hbm_after))
