"""8-bit weights (W8A16) end to end: the quantisation rule and the INT8 tile (hw/numerics.py), the ISA's int8 flag,
the compiler's INT8 image, the functional simulator and the cycle model.

Stated bounds (host/runtime/generation.py): the appliance with INT8 weights against the same model quantised in
PyTorch (host.reference.models.int8_model, FP32 arithmetic) within LOGITS_BOUND, as FP16 weights are against the
FP32 model; against the FP32 model itself within INT8_LOGITS_BOUND (the quantisation's own error). Logits are
bit-identical across card counts, as with FP16 weights.
"""
from fractions import Fraction

import numpy as np
import pytest

from ringgpt.host.compiler import CompileError, compile_model
from ringgpt.host.reference.generate import generate as reference_generate
from ringgpt.host.reference.models import int8_model, load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import Appliance, relative_rms
from ringgpt.host.runtime.generation import INT8_LOGITS_BOUND, LOGITS_BOUND
from ringgpt.hw import numerics
from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Dim, Flags, IllegalInstructionError, Instruction, Opcode, Operand, Space, decode
from ringgpt.hw.resolved import Resolved, access_blocks, misaligned_weights
from ringgpt.sim.cycle_model.costs import instruction_cost
from ringgpt.sim.functional import SimulatorDevice

WIDTHS = {"124m": (768, 12), "345m": (1024, 16), "774m": (1280, 20), "1.5b": (1600, 25)}


def bits32(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


# --- the numerics -------------------------------------------------------------------------------------

def test_quantize_int8_rounds_each_column_to_its_own_scale():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((40, 9)).astype(np.float32) * np.array([1, 1e-3, 50, 1, 1, 1, 1, 1, 0], np.float32)
    q, scale = numerics.quantize_int8(w)
    assert q.dtype == np.int8 and scale.dtype == np.float16 and q.shape == w.shape and scale.shape == (9,)
    assert np.abs(q).max() <= numerics.INT8_LIMIT and (q != -128).all()
    assert scale[-1] == 1 and (q[:, -1] == 0).all()                      # an all-zero column
    peak = np.abs(w[:, :-1]).max(axis=0)
    assert np.allclose(scale[:-1].astype(np.float32), peak / 127, rtol=1e-3)
    assert (np.abs(q[:, :-1]).max(axis=0) >= 126).all()                 # the largest weight uses the range
    back = numerics.dequantize_int8(q, scale)
    assert (np.abs(back - w) <= scale.astype(np.float32) / 2 * 1.001 + 1e-12).all()


def test_pack_int8_puts_the_low_byte_first_and_round_trips():
    q = np.array([[1, -2, 127], [-127, 0, 5]], np.int8)
    words = numerics.pack_int8(q)
    assert words.shape == (2, 2) and words.dtype == np.float16
    assert words.view(np.uint16)[0, 0] == 1 | (0xFE << 8) and words.view(np.uint16)[0, 1] == 127   # odd k: zero pad
    assert np.array_equal(numerics.unpack_int8(words, 3), q)


def exact_tile(x: np.ndarray, q: np.ndarray) -> np.float32:
    """int8_tile_sums by exact rationals, for finite x: truncate to the tile's grid, sum, round once."""
    finite = x.astype(np.float64)
    nonzero = finite[finite != 0]
    if nonzero.size == 0:
        return np.float32(0.0)
    emax = max(max(int(np.frexp(abs(v))[1]) + 14, 1) for v in nonzero)   # the FP16 exponent field, subnormals 1
    grid = Fraction(2) ** (emax - 25 - numerics.INT8_GUARD_BITS)
    total = sum((int(Fraction(float(v)) / grid) * grid * int(w) for v, w in zip(finite, q)), Fraction(0))
    return np.float32(float(total))


def test_int8_tile_sums_truncate_to_the_tiles_grid_and_round_once():
    rng = np.random.default_rng(2)
    for trial in range(300):
        spread = (1, 8, 20, 40)[trial % 4]     # exponents within the guard bits, and far below them
        x = (rng.standard_normal(16) * 2.0 ** rng.integers(-spread, min(spread // 2, 10) + 1, 16)).astype(np.float16)
        q = rng.integers(-127, 128, 16).astype(np.int8)
        got = numerics.int8_tile_sums(x, q)
        want = exact_tile(x, q)
        assert bits32(got) == bits32(want) or (got == 0 and want == 0), (x, q, got, want)


def test_int8_tile_specials_and_signed_zeros():
    f = np.float16
    tile = numerics.int8_tile_sums
    assert np.isnan(tile(np.array([np.inf, 1], f), np.array([0, 3], np.int8)))     # Inf x 0
    assert np.isnan(tile(np.array([np.inf, -np.inf], f), np.array([1, 1], np.int8)))
    assert tile(np.array([np.inf, 1], f), np.array([-2, 3], np.int8)) == -np.inf
    assert np.isnan(tile(np.array([np.nan, 1], f), np.array([1, 1], np.int8)))
    assert bits32(tile(np.array([-0.0, -1], f), np.array([5, 0], np.int8))) == 0x80000000   # every product -0
    assert bits32(tile(np.array([1, -1], f), np.array([1, 1], np.int8))) == 0                # cancellation: +0
    assert bits32(tile(np.array([-0.0, 0.0], f), np.array([5, 0], np.int8))) == 0             # a +0 product


@pytest.mark.parametrize("width", [4, 8, 64])
def test_int8_matmul_acc_is_the_tile_rule_tile_by_tile(width):
    """The fast path (one float64 product a tile) bit for bit against int8_tile_sums and add_in_order, on rows with
    zeros, subnormals, wide exponent ranges, signed zeros, infinities and NaNs."""
    rng = np.random.default_rng(width)
    m, k, n = 7, 5 * width + 3, 11
    x = (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-30, 12, (m, k))).astype(np.float16)
    x[1] = 0
    x[2, ::2] = -0.0
    x[2, 1::2] = 0
    x[3, 5] = np.inf
    x[4, 0] = np.nan
    x[5] = rng.standard_normal(k).astype(np.float16) * np.float16(1e-6)
    q = rng.integers(-127, 128, (k, n)).astype(np.int8)
    q[:, 3] = 0
    got = numerics.int8_matmul_acc(x, q, width)
    tile = numerics.INT8_TILE_ROWS * width
    tiles = -(-k // tile)
    xp = np.zeros((m, tiles * tile), np.float16)
    xp[:, :k] = x
    qp = np.zeros((tiles * tile, n), np.int8)
    qp[:k] = q
    sums = numerics.int8_tile_sums(xp.reshape(m, 1, tiles, tile), qp.T.reshape(1, n, tiles, tile))
    want = numerics.add_in_order(sums, axis=-1)
    assert np.array_equal(bits32(got), bits32(want))


def test_the_compiled_int8_sums_equal_numpys():
    """hw/native.py's int8_sums against its numpy fallback (numerics._int8_sums): every exact sum of a tile without
    specials, and every tile's emax (-1 with an Inf or NaN)."""
    from ringgpt.hw import native
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((6, 301)) * 2.0 ** rng.integers(-26, 9, (6, 301))).astype(np.float16)
    x[1, 7], x[2, 200], x[3] = np.inf, np.nan, 0
    q = rng.integers(-127, 128, (301, 37)).astype(np.int8)
    found = native.int8_sums(x, q, 16)
    if found is None:
        pytest.skip("no compiled kernel here (RINGGPT_NATIVE=0 or no C compiler)")
    total, emax = numerics._int8_sums(x, q, 16)
    assert np.array_equal(found[1], emax) and (emax[1:3] == -1).any(axis=1).all()
    ok = np.broadcast_to((emax >= 0)[:, None, :], total.shape)
    assert np.array_equal(found[0][ok], total[ok])


def test_int8_matmul_scales_each_column_before_the_bias():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 100)).astype(np.float16)
    q = rng.integers(-127, 128, (100, 6)).astype(np.int8)
    scale = (rng.random(6) * 0.01).astype(np.float16)
    bias = rng.standard_normal(6).astype(np.float16)
    acc = numerics.int8_matmul_acc(x, q, 8)
    want = numerics.to_fp16(numerics.add_fp32(numerics.mul_fp32(acc, scale.astype(np.float32)),
                                              bias.astype(np.float32)))
    assert np.array_equal(numerics.matmul(x, q, 8, bias, scale=scale).view(np.uint16), want.view(np.uint16))
    with pytest.raises(ValueError, match="scale exactly when"):
        numerics.matmul(x, q, 8, bias)


# --- the instruction set ------------------------------------------------------------------------------

def int8_matmul(**fields) -> Instruction:
    base = dict(dst=Operand(Space.ABUF, 0, 0), src1=Operand(Space.ABUF, 0, 1024), src2=Operand(Space.WBUF, 0, 0),
                aux=Operand(Space.WBUF, 0, 4096), rows=Dim(0, 1), n=Dim(0, 16), k=Dim(0, 256), src2_stride=128,
                aux_stride=16, flags=Flags(int8=1))
    base.update(fields)
    return Instruction.make(Opcode.MATMUL, **base)


def test_the_int8_flag_needs_the_scales_and_aux_stride_needs_the_flag():
    inst = int8_matmul()
    assert decode(inst.encode()) == inst and "+int8" in str(inst)
    with pytest.raises(IllegalInstructionError, match=r"aux.space.*\+int8 takes WBUF"):
        int8_matmul(aux=Operand())
    with pytest.raises(IllegalInstructionError, match="aux_stride.*only with the int8 flag"):
        int8_matmul(flags=Flags())
    with pytest.raises(IllegalInstructionError, match="does not take this flag"):
        Instruction.make(Opcode.VADD, dst=Operand(Space.ABUF, 0, 0), src1=Operand(Space.ABUF, 0, 0),
                         src2=Operand(Space.ABUF, 0, 0), rows=Dim(0, 1), n=Dim(0, 1), flags=Flags(int8=1))


def resolved_int8(k=256, n=16, src1=1024, src1_stride=0, src2=0, stride=128) -> Resolved:
    return Resolved(Opcode.MATMUL, rows=1, n=n, k=k, dst=(Space.ABUF, 0), src1=(Space.ABUF, src1),
                    src2=(Space.WBUF, src2), aux=(Space.WBUF, 4096), src1_stride=src1_stride, src2_stride=stride,
                    aux_stride=n, flags=Flags(int8=1))


def test_int8_footprints_alignment_and_cost():
    cfg = get_config("u280", 1)
    r = resolved_int8()
    reads, _ = access_blocks(r)
    weights = next(b for b in reads if b.operand == "src2")
    aux = next(b for b in reads if b.operand == "aux")
    assert (weights.rows, weights.cols, weights.stride) == (16, 128, 128)      # k bytes: k / 2 words a column
    assert (aux.rows, aux.cols, aux.stride) == (2, 16, 16)                      # the biases, then the scales
    assert misaligned_weights(r, 64) is None
    assert "activations (src1)" in misaligned_weights(resolved_int8(src1=1056), 64)
    assert "weights (src2)" in misaligned_weights(resolved_int8(stride=96), 64)
    fp16 = r._replace(flags=Flags(), src2_stride=256, aux_stride=0)
    big_k = 64 * 64   # one MATMUL of many tiles: the beats dominate
    assert (instruction_cost(resolved_int8(k=big_k, stride=big_k // 2), cfg).cycles
            < 0.6 * instruction_cost(fp16._replace(k=big_k, src2_stride=big_k), cfg).cycles)


# --- the compiler and the appliance --------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return load_model("synthetic:n_layer=2,n_embd=192,n_head=3,vocab_size=300", seed=1)


def test_int8_image_holds_each_piece_quantised_with_its_biases_and_scales(tiny):
    cfg = get_config("sim-small", 2)
    fp16, int8 = compile_model(tiny, cfg, 32), compile_model(tiny, cfg, 32, weights="int8")
    assert fp16.meta["weights"] == "fp16" and int8.meta["weights"] == "int8"
    for card in range(2):
        def region(image, name):
            return next(r for r in image.meta["hbm_map"][card] if r["name"] == name)
        stream16, stream8 = region(fp16, "layer weights"), region(int8, "layer weights")
        assert stream8["words"] < 0.6 * stream16["words"]
        assert region(int8, "lm_head")["words"] > 0                           # an INT8 copy beside wte's rows
    layer = tiny.transformer.h[0]
    q, scale = numerics.quantize_int8(layer.mlp.c_fc.weight.detach().numpy())
    program = int8.cards[0].program.instructions
    matmuls = [i for i in program if i.opcode is Opcode.MATMUL and i.flags.int8]
    assert matmuls and all(i.aux.space is Space.WBUF and i.aux_stride == i.n.imm for i in matmuls)
    # card 0's first fc piece in HBM: its packed columns, biases and scales are the quantised model's
    segments = dict(int8.cards[0].hbm_segments)
    start = next(r["start"] for r in int8.meta["hbm_map"][0] if r["name"] == "layer weights")
    stream = segments[start]
    found = False
    for inst in (i for i in matmuls if i.flags.gelu):      # the first MLP layer's pieces (GELU fused)
        cols, k = inst.n.imm, inst.k.imm
        stride = inst.src2_stride
        for at in range(0, stream.size - cols * (stride + 2) + 1, 64):
            block = stream[at:at + cols * stride].reshape(cols, stride)
            got = numerics.unpack_int8(block[:, :k // 2], k)
            if np.array_equal(got, q[:, :cols].T):
                assert np.array_equal(stream[at + cols * (stride + 1):at + cols * (stride + 2)], scale[:cols])
                found = True
                break
        if found:
            break
    assert found, "card 0's first fc piece is not the quantised weights, biases and scales"


def test_unknown_weight_format_is_a_clear_error(tiny):
    with pytest.raises(CompileError, match=r"weights='int4': choose one of fp16, int8"):
        compile_model(tiny, get_config("sim-small", 1), 32, weights="int4")


def test_check_compares_each_layer_with_the_quantised_model(tiny):
    """ringgpt check's comparison (host/check.py) of an INT8 image with int8_model: every probe within its bound; with
    the unquantised model as the reference the QKV probe alone is already off by the quantisation's error."""
    from ringgpt.host.check import check_layers
    cfg = get_config("sim-small", 2)
    image = compile_model(tiny, cfg, 32, weights="int8")
    report = check_layers(int8_model(tiny), image, SimulatorDevice(cfg), [5, 17, 42], decode_steps=2)
    assert report.passed, report.verdict()
    unquantised = check_layers(tiny, image, SimulatorDevice(cfg), [5, 17, 42], decode_steps=2)

    def qkv(r):
        return max(p.rel_rms for p in r.results if p.name == "L0.qkv")
    assert qkv(unquantised) > 5 * qkv(report)


def appliance_logits(image, prompt: list, continuation: list) -> np.ndarray:
    return Appliance(SimulatorDevice(image.config), image).teacher_forced(prompt, continuation[:-1])


@pytest.mark.parametrize("width,cards_list", [("124m", (1, 4)), ("345m", (1, 3)), ("774m", (2,)), ("1.5b", (1, 2))])
def test_int8_real_widths_within_bounds(width, cards_list):
    """GPT-2's four widths (one layer, a 2,048-token vocabulary) on the u280 preset: logits within LOGITS_BOUND of
    the same model quantised in PyTorch and within INT8_LOGITS_BOUND of the FP32 model, greedy tokens equal to the
    quantised model's, and bit-identical across card counts."""
    d, heads = WIDTHS[width]
    model = load_model(f"synthetic:n_layer=1,n_embd={d},n_head={heads},vocab_size=2048", seed=d)
    quantised = int8_model(model)
    prompt = [int(t) for t in np.random.default_rng(d).integers(0, 2048, 5)]
    sampling = SamplingConfig(max_new_tokens=3, stop_at_eos=False)
    ref = reference_generate(quantised, prompt, sampling)
    full = reference_generate(model, prompt, SamplingConfig(max_new_tokens=3, stop_at_eos=False))
    results = []
    for cards in cards_list:
        image = compile_model(model, get_config("u280", cards), max_context=64, weights="int8")
        logits = appliance_logits(image, prompt, ref.generated_ids)
        error = relative_rms(logits, ref.logits)
        assert error <= LOGITS_BOUND, f"{width} on {cards} cards: {error:.2e} against the quantised model"
        assert [int(np.argmax(row)) for row in logits] == ref.generated_ids
        if full.generated_ids == ref.generated_ids:   # the same tokens fed back: comparable steps
            assert relative_rms(logits, full.logits) <= INT8_LOGITS_BOUND
        results.append(logits)
    assert all(np.array_equal(r, results[0]) for r in results[1:])


def test_int8_widths_off_the_u280_boundaries_compile_and_agree():
    """n_embd 48 on the u280 preset with INT8 weights: its activation rows padded to 64 words (layout.activation_row),
    so every MATMUL's activations lie on weight_align boundaries (the compile stopped at the plan check before);
    logits within LOGITS_BOUND of the quantised model, bit-identical on 1 and 2 cards, with a max_context of 20."""
    model = load_model("synthetic:n_layer=2,n_embd=48,n_head=3,vocab_size=100", seed=3)
    prompt = [5, 17, 42, 7, 9]
    ref = reference_generate(int8_model(model), prompt, SamplingConfig(max_new_tokens=4, stop_at_eos=False))
    results = [appliance_logits(compile_model(model, get_config("u280", cards), max_context=20, weights="int8"),
                                prompt, ref.generated_ids) for cards in (1, 2)]
    assert relative_rms(results[0], ref.logits) <= LOGITS_BOUND
    assert np.array_equal(results[0], results[1])


def test_int8_decode_moves_half_the_weight_bytes_and_takes_fewer_cycles():
    model = load_model("synthetic:n_layer=1,n_embd=768,n_head=12,vocab_size=2048", seed=5)
    cfg = get_config("u280", 1)
    stats = {}
    for weights in ("fp16", "int8"):
        app = Appliance(SimulatorDevice(cfg), compile_model(model, cfg, 64, weights=weights))
        app.prefill([1, 2, 3])
        stats[weights] = app.run(3, [4])
    assert stats["int8"].hbm_bytes < 0.6 * stats["fp16"].hbm_bytes
    assert stats["int8"].cycles < 0.8 * stats["fp16"].cycles
