"""The compiler: partitioning, memory maps and their capacity checks, the activation-buffer plan, the weight
stream, and programs that decode, validate and carry their config."""
import re

import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel

from ringgpt.host.compiler import CapacityError, CompileError, compile_model, partition, split
from ringgpt.host.compiler.build import CardBuilder, Context, Piece
from ringgpt.host.compiler.layout import (CardShape, KVArea, choose_abuf_plans, choose_kv, region_align,
                                          stream_align)
from ringgpt.host.compiler.model import ModelDims
from ringgpt.host.errors import RingGPTError
from ringgpt.host.image import ApplianceImage
from ringgpt.host.reference.models import load_model, synthetic_config
from ringgpt.host.runtime import Appliance
from ringgpt.hw.config import get_config
from ringgpt.hw.resolved import resolve_run
from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.isa import NUM_REGS, Instruction, Opcode, Space, decode
from ringgpt.hw.program import Program
from ringgpt.sim.functional import SimulatorDevice


def meta_model(spec: str) -> GPT2LMHeadModel:
    """A GPT-2 of the synthetic spec without weights (layout and programs only)."""
    with torch.device("meta"):
        return GPT2LMHeadModel(synthetic_config(spec))


@pytest.fixture(scope="module")
def tiny():
    return load_model("synthetic:n_layer=2,n_embd=192,n_head=3,vocab_size=300", seed=1)


# --- partitioning ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cards", [1, 2, 4])
@pytest.mark.parametrize("heads", range(1, 26))
def test_partition_covers_every_dimension_once(heads, cards):
    d = 64 * heads
    part = partition(heads, d, 4 * d, 50257, cards, 32)
    for spans, total in ((part.heads, heads), (part.embd, d), (part.ffn, 4 * d), (part.vocab, 50257)):
        assert len(spans) == cards
        assert spans[0][0] == 0 and spans[-1][1] == total
        assert all(a <= b for a, b in spans)
        assert all(spans[i][1] == spans[i + 1][0] for i in range(cards - 1))
    sizes = [b - a for a, b in part.heads]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    for spans in (part.embd, part.vocab):  # whole lane groups except where the dimension ends
        assert all(a % 32 == 0 for a, _ in spans)


def test_partition_of_uneven_head_counts():
    assert partition(25, 1600, 6400, 50257, 4, 32).heads == ((0, 7), (7, 13), (13, 19), (19, 25))
    assert partition(3, 192, 768, 50257, 4, 32).heads == ((0, 1), (1, 2), (2, 3), (3, 3))
    assert partition(3, 192, 768, 50257, 2, 32).heads == ((0, 2), (2, 3))


def test_partition_balances_weights_per_card():
    """The MLP split evens out what an uneven head split leaves: GPT-2 1.5B (25 heads) on 4 cards streams
    within 1% of the mean per card, against 4.7% over it for an even MLP split."""
    d, inner = 1600, 6400
    part = partition(25, d, inner, 50257, 4, 32)

    def words(ffn):
        return [3 * 64 * (h1 - h0) * d + d * (e1 - e0) + d * (f1 - f0) + inner * (e1 - e0)
                for (h0, h1), (e0, e1), (f0, f1) in zip(part.heads, part.embd, ffn)]
    mean = 12 * d * d / 4
    assert max(words(split(inner, 4, 32))) / mean > 1.04
    assert max(words(part.ffn)) / mean < 1.01


def test_split_gives_empty_pieces_when_short():
    assert split(2, 4) == ((0, 1), (1, 2), (2, 2), (2, 2))
    assert split(100, 3, 32) == ((0, 64), (64, 96), (96, 100))


# --- HBM memory map ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,config,cards", [("gpt2-124m", "u280", 4), ("gpt2-355m", "u280", 1),
                                               ("gpt2-1.5b", "u280", 4),
                                               ("n_layer=2,n_embd=320,n_head=5,vocab_size=1000", "sim-small", 2)])
def test_hbm_map_is_disjoint_and_within_capacity(spec, config, cards):
    cfg = get_config(config, cards)
    model = meta_model(spec)
    image = compile_model(model, cfg)
    dims = ModelDims.of(model)
    for index, (card, regions) in enumerate(zip(image.cards, image.meta["hbm_map"])):
        spans = sorted((r["start"], r["start"] + r["words"]) for r in regions)
        assert all(a1 <= b0 for (_, a1), (b0, _) in zip(spans, spans[1:]))
        assert spans[-1][1] == card.hbm_words <= cfg.hbm_words
        kv = [r for r in regions if r["kind"] == "kv"]
        h0, h1 = image.meta["partition"]["heads"][index]
        assert len(kv) == (dims.n_layer if h1 > h0 else 0)
        assert all(r["words"] == 1024 * 2 * (h1 - h0) * 64 for r in kv)
        weights = [r for r in regions if r["kind"] == "weights"]
        assert {"wte", "wpe", "layernorm", "layer weights"} <= {r["name"] for r in weights}
        assert card.hbm_segments == []  # a meta model has no weights to place
    assert image.meta["weights_hash"] is None


def test_segments_lie_in_weight_regions_and_hold_transposed_weights(tiny):
    image = compile_model(tiny, get_config("u280", 2), max_context=64)
    block = tiny.transformer.h[1]
    for card, regions in zip(image.cards, image.meta["hbm_map"]):
        weights = [(r["start"], r["start"] + r["words"]) for r in regions if r["kind"] == "weights"]
        for address, data in card.hbm_segments:
            assert any(a <= address and address + data.size <= b for a, b in weights)
    # Card 1's fc2 slice of layer 1: columns 96.. of c_proj (n_embd=192 split 96/96), stored column-major + bias.
    ctx_card = _builder(tiny, 2, 1)
    piece = next(p for p in ctx_card.pieces if p.origin[:2] == (1, 3))
    segment = dict(image.cards[1].hbm_segments)[ctx_card.stream_start]
    start = piece.hbm - ctx_card.stream_start
    data = segment[start:start + piece.words]
    cols = np.arange(96, 96 + piece.cols)
    w = block.mlp.c_proj.weight.detach().half().numpy()
    np.testing.assert_array_equal(data[:piece.cols * piece.k], w[:, cols].T.ravel())
    np.testing.assert_array_equal(data[piece.cols * piece.k:], block.mlp.c_proj.bias.detach().half().numpy()[cols])


@pytest.mark.parametrize("cards", [1, 2])
def test_weight_columns_are_padded_to_tile_boundaries(cards):
    """n_embd = 48 at u280 (weight_align 64): every weight column of k = 48 in HBM and WBUF is 64 words apart (48
    words, 16 zeros), and so are wte's rows (the tied LM head's columns, GATHER's table); the attention's keys (head_dim
    16) lie in 64-word slots and V^T in rows of 64 (max_context 16) in the KV areas (layout.KVArea, in WBUF above the
    weight slots), so that every MATMUL's and MASKED_QK's weights start and step on 64-word boundaries
    (hw/resolved.misaligned_weights). The HBM K cache keeps the same slots (a row of 3 x 64 words on one card; one
    STORE a head appends the keys), V^T rows of 64 and wpe's rows 64 apart (n_embd 48 is not a multiple of the 32-word
    beat: the embedding's rows are staged in BIG), so that every transfer keeps its words' offsets in the beat
    (hw/resolved.misaligned_transfer). The logits of a prompt run and of a decode step after it (whose keys and values
    come back from the HBM cache) are within LOGITS_BOUND of the FP32 reference."""
    from ringgpt.host.runtime import LOGITS_BOUND, relative_rms
    from ringgpt.hw.resolved import misaligned_weights, resolve_run, with_gather_slices
    model = load_model("synthetic:n_layer=1,n_embd=48,n_head=3,vocab_size=64", seed=3)
    cfg = get_config("u280", cards)
    image = compile_model(model, cfg, max_context=16)
    runs = with_gather_slices([resolve_run(card.program.instructions, c, 2, 3) for c, card in enumerate(image.cards)])
    kv_start = image.meta["abuf"][0]["kv_start"]             # the weight slots below, the KV areas from here
    matrix = [r for run in runs for r in run if r is not None and r.op in (Opcode.MATMUL, Opcode.MASKED_QK)]
    assert {r.src2[0] for r in matrix} == {Space.WBUF}
    matmuls = [r for r in matrix if r.src2[1] < kv_start]
    assert {r.src2_stride for r in matmuls} == {64, 192}      # k = 48 padded; fc2's k = n_inner = 192
    attention = [r for r in matrix if r.src2[1] >= kv_start]
    key_rows = {1: {3 * 64}, 2: {2 * 64, 64}}[cards]         # the card's heads (3, or 2 and 1) a 64-word slot each
    assert {(r.op, r.src2_stride) for r in attention} == {(Opcode.MASKED_QK, row) for row in key_rows} | {
        (Opcode.MATMUL, 64)}
    assert not [r for run in runs for r in run if r is not None and misaligned_weights(r, cfg.weight_align)]
    gather = next(r for r in runs[0] if r is not None and r.op is Opcode.GATHER)
    assert gather.src1_stride == 64
    wte = dict(image.cards[0].hbm_segments)[gather.src1[1]].reshape(64, 64)
    np.testing.assert_array_equal(wte[:, :48], model.transformer.wte.weight.detach().half().numpy())
    assert not wte[:, 48:].any()
    wpe_at = next(r["start"] for r in image.meta["hbm_map"][0] if r["name"] == "wpe")
    wpe = dict(image.cards[0].hbm_segments)[wpe_at].reshape(16, 64)
    np.testing.assert_array_equal(wpe[:, :48], model.transformer.wpe.weight[:16].detach().half().numpy())
    assert not wpe[:, 48:].any()
    key_stores = [r for r in runs[0] if r is not None and r.op is Opcode.STORE and r.n == 16 and not r.flags.transpose]
    assert len(key_stores) == {1: 3, 2: 2}[cards] and {r.dst_stride for r in key_stores} == {max(key_rows)}
    prompt = [5, 17, 42, 9]
    appliance = Appliance(SimulatorDevice(cfg), image)
    for ids in (prompt[:3], prompt[3:]):                # a prompt run, then a decode step
        appliance.prefill(ids, pos=0 if len(ids) > 1 else 3)
        with torch.no_grad():
            want = model(torch.tensor([prompt[:3] + ids[:1] if len(ids) == 1 else ids])).logits[0, -1].numpy()
        assert relative_rms(appliance.logits(), want) <= LOGITS_BOUND


@pytest.mark.parametrize("spec,config,cards,max_context,weights", [
    ("n_layer=2,n_embd=48,n_head=3,vocab_size=64", "u280", 1, 16, "fp16"),
    ("n_layer=2,n_embd=48,n_head=3,vocab_size=64", "u280", 2, 20, "int8"),
    ("n_layer=1,n_embd=48,n_head=3,vocab_size=64", "sim-small", 2, 20, "fp16"),
    ("n_layer=1,n_embd=36,n_head=3,vocab_size=64", "sim-small", 1, 13, "int8"),
    ("n_layer=1,n_embd=64,n_head=4,vocab_size=64", "u280", 4, 64, "fp16"),
    ("n_layer=2,n_embd=320,n_head=5,vocab_size=1000", "sim-small", 2, 128, "fp16"),
    ("n_layer=1,n_embd=1600,n_head=25,vocab_size=2048", "u280", 4, 1024, "fp16")])
def test_every_word_keeps_the_alignment_rules(spec, config, cards, max_context, weights):
    """Every LOAD and GATHER from HBM or the host puts each word at the same offset within its HBM beat in the buffer
    as in HBM (hw/resolved.misaligned_transfer), every matrix instruction's weights (and with INT8 weights its
    activations) lie on weight_align boundaries (misaligned_weights) and every vector instruction's operands on
    vector_align boundaries (misaligned_vector): the RTL refuses each. For runs at the start, in the middle and at
    the end of the context: regions start on region_align, the K cache keeps the KV areas' key slots, the V cache
    their V^T rows, LayerNorm blocks and wpe rows are padded, and n_embd 48 at u280 (not a multiple of its 32-word
    beat nor of its 64-word vector_align and weight_align) and 36 at sim-small (not of its 8) lay their activation
    rows 64 and 40 words apart (activation_row), the score rows of max_context 20 and 13 64 and 16 (score_row)."""
    from ringgpt.hw.resolved import (misaligned_transfer, misaligned_vector, misaligned_weights, resolve_run,
                                     with_gather_slices)
    cfg = get_config(config, cards)
    beat = cfg.hbm_port_bits // 16
    image = compile_model(meta_model(spec), cfg, max_context=max_context, weights=weights)
    rows = image.meta["max_rows"]
    transfers = 0
    for pos, n in ((0, rows), (max_context // 2, 1), (max_context - min(rows, 3), min(rows, 3)), (max_context - 1, 1)):
        runs = with_gather_slices([resolve_run(card.program.instructions, c, pos, n)
                                   for c, card in enumerate(image.cards)])
        for run in runs:
            for r in run:
                if r is not None:
                    assert misaligned_vector(r, cfg.vector_align) is None, (pos, n, r)
                    assert misaligned_weights(r, cfg.weight_align) is None, (pos, n, r)
                if r is not None and r.op in (Opcode.LOAD, Opcode.GATHER) and r.src1[0] in (Space.HBM, Space.HOST):
                    assert misaligned_transfer(r, beat) is None, (pos, n, r)
                    transfers += 1
    assert transfers > 0
    gather = next(i for i in image.cards[0].program.instructions if i.opcode is Opcode.GATHER)
    assert gather.dst_stride % beat == 0


def test_q_weights_carry_the_attention_scale(tiny):
    """1/sqrt(64) = 1/8 is folded into the Q columns (a power of two: exact but where it reaches FP16
    subnormals); K and V are unscaled."""
    builder = _builder(tiny, 1, 0)
    image = compile_model(tiny, get_config("u280", 1), max_context=64)
    segment = dict(image.cards[0].hbm_segments)[builder.stream_start]
    w32 = tiny.transformer.h[0].attn.c_attn.weight.detach()
    w = w32.half().numpy()
    pieces = [p for p in builder.pieces if p.origin[:2] == (0, 0)]
    stored = np.concatenate([segment[p.hbm - builder.stream_start:][:p.cols * p.k].reshape(p.cols, p.k)
                             for p in pieces])
    d = 192
    np.testing.assert_array_equal(stored[:2 * d], w[:, d:].T)           # K, V columns first
    np.testing.assert_array_equal(stored[2 * d:], (w32[:, :d] / 8).half().numpy().T)  # then Q, scaled


def _builder(model, cards: int, card: int) -> CardBuilder:
    cfg = get_config("u280", cards)
    dims = ModelDims.of(model)
    part = partition(dims.n_head, dims.n_embd, dims.n_inner, dims.vocab_size, cards, cfg.mpu_lanes)
    shapes = [CardShape(b - a, v1 - v0) for (a, b), (v0, v1) in zip(part.heads, part.vocab)]
    kv = choose_kv(cfg, 64, [b - a for a, b in part.heads], 64, 2)
    plans = choose_abuf_plans(cfg, dims.n_embd, dims.n_inner, 64, shapes, 64, kv)
    ctx = Context(model, cfg, dims, part, 64, plans, 2, kv.slot_words, True, 0, 0)
    return CardBuilder(ctx, card)


def test_capacity_error_names_weights_card_and_bytes_over():
    cfg = get_config("sim-small", 1)
    with pytest.raises(CapacityError) as info:
        compile_model(meta_model("gpt2-1.5b"), cfg)
    message = str(info.value)
    assert "weights do not fit card 0's HBM" in message
    over = int(re.search(r"\(([\d,]+) bytes over\)", message).group(1).replace(",", ""))
    assert over > 2.5e9 and isinstance(info.value, RingGPTError)


def test_capacity_error_names_the_kv_cache():
    """GPT-2 124M's weights fit one sim-small card (256 MiB), its KV cache for 1024 tokens does not."""
    cfg = get_config("sim-small", 1)
    with pytest.raises(CapacityError, match=r"KV cache for max_context=1024 .* card 0's HBM .* bytes over"):
        compile_model(meta_model("gpt2-124m"), cfg, 1024)
    compile_model(meta_model("gpt2-124m"), cfg, 128)


def test_two_cards_hold_what_one_cannot():
    compile_model(meta_model("gpt2-124m"), get_config("sim-small", 2), 1024)


# --- activation buffer ----------------------------------------------------------------------------

@pytest.mark.parametrize("spec,config,cards", [("gpt2-355m", "u280", 1), ("gpt2-1.5b", "u280", 4),
                                               ("gpt2-124m", "u280", 2),
                                               ("n_layer=2,n_embd=192,n_head=3", "sim-small", 1)])
def test_abuf_plan_fits_and_regions_do_not_overlap(spec, config, cards):
    cfg = get_config(config, cards)
    image = compile_model(meta_model(spec), cfg)
    max_rows = image.meta["max_rows"]
    assert 1 <= max_rows <= image.meta["max_context"]
    for plan in image.meta["abuf"]:
        assert plan["max_rows"] == max_rows
        # Top-level regions are disjoint; QKV and SCORES lie inside BIG (reused within a layer).
        regions = {k: v for k, v in plan["regions"].items() if k not in ("QKV", "SCORES")}
        spans = sorted((a, a + n) for a, n in regions.values())
        assert all(a1 <= b0 for (_, a1), (b0, _) in zip(spans, spans[1:]))
        assert spans[-1][1] <= cfg.abuf_words
        big0, big_words = plan["regions"]["BIG"]
        for name in ("QKV", "SCORES"):
            start, words = plan["regions"][name]
            assert big0 <= start and start + words <= big0 + big_words


def test_abuf_plan_prefers_large_runs_and_kv_groups():
    """On the u280 the planner keeps whole-card KV groups in the weight buffer, after both weight slots, and the
    activation buffer processes a 128-token prompt in one run."""
    cfg = get_config("u280", 4)
    image = compile_model(meta_model("gpt2-1.5b"), cfg)
    plan = image.meta["abuf"][0]
    assert plan["kv_group"] == 7 and image.meta["max_rows"] >= 128
    kv_words = plan["kv_areas"] * KVArea(64, 1024, 7, region_align(cfg)).words
    # two weight slots of 1,769,472 words (3.4 MiB) below the KV area, which fits before WBUF's end
    assert plan["kv_start"] == 2 * 1_769_472 and plan["kv_start"] + kv_words <= cfg.wbuf_words
    assert compile_model(meta_model("gpt2-124m"), get_config("u280", 4), max_rows=5).meta["max_rows"] == 5


def test_wbuf_too_small_for_the_context_is_a_clear_error():
    """One head's keys and V^T for 2,048 positions (262,144 words) do not fit sim-small's weight buffer."""
    model = meta_model("n_layer=1,n_embd=128,n_head=2,n_positions=2048,vocab_size=100")
    with pytest.raises(CapacityError, match=r"weight buffer .* one head's keys and V\^T for max_context=2048"):
        compile_model(model, get_config("sim-small", 1), 2048)


def test_a_forced_kv_group_too_large_names_the_group():
    """GPT-2 345M's 16 heads at max_context 1024 in one group (2 M words) exceed u280's KV share (1.49 M words)."""
    with pytest.raises(CapacityError, match=r"cannot hold a group of 16 heads' keys and V\^T for max_context=1024 "
                                            r"\(2,097,152 words\) .*: lower max_context, a smaller kv_group"):
        compile_model(meta_model("gpt2-355m"), get_config("u280", 1), 1024, kv_group=16)


def test_abuf_too_small_for_one_row_is_a_clear_error():
    model = meta_model("n_layer=1,n_embd=16384,n_head=256,n_positions=64,vocab_size=100")
    with pytest.raises(CapacityError, match=r"activation buffer .* one token's activations and scores"):
        compile_model(model, get_config("sim-small", 1), 64)


# --- weight stream --------------------------------------------------------------------------------

def test_pieces_fit_slots_and_cover_each_slice_once():
    builder = _builder(meta_model("gpt2-124m"), 2, 0)
    slot = builder.ctx.slot_words
    assert builder.plan.kv_start >= 2 * slot
    assert all(isinstance(p, Piece) and p.words <= slot for p in builder.pieces)
    covered: dict = {}
    for p in builder.pieces:
        covered.setdefault(p.origin[:2], []).append((p.origin[2], p.cols))
    for (layer, index), spans in covered.items():
        expect = len(builder.columns[index]) if layer < 12 else builder.v1 - builder.v0
        assert sorted(spans)[0][0] == 0 and sum(c for _, c in spans) == expect


def test_every_layer_piece_starts_on_an_hbm_stripe():
    """So that its LOAD starts all 32 DMA engines at once and their rows never wait for each other's buffer
    memory (stream_align; started mid-stripe, the cycle model charges the waits: sim/cycle_model/grants.py)."""
    builder = _builder(meta_model("gpt2-124m"), 2, 0)
    config = builder.ctx.config
    stripe = config.hbm_channels * config.hbm_interleave_words
    assert stream_align(config) == stripe == 4096
    layers = [p for p in builder.pieces if p.hbm_region == "layer weights"]
    assert len(layers) > 12 and all(p.hbm % stripe == 0 for p in layers)
    # with INT8 weights the LM head has its own copy, its pieces on stripes too (the tied one's are wte's columns)
    image = compile_model(meta_model("gpt2-124m"), get_config("u280", 1), 64, weights="int8")
    streams = [resolved for resolved in resolve_run(image.cards[0].program.instructions, 0, 8, 1)
               if resolved is not None and resolved.op is Opcode.LOAD and resolved.src1[0] is Space.HBM
               and resolved.n >= 1 << 16]
    assert len(streams) > 12 and all(r.src1[1] % stripe == 0 for r in streams)


def test_weight_slot_is_never_overwritten_before_it_is_read():
    """In program order, a LOAD into a weight-buffer slot comes after every MATMUL that reads the slot's
    previous contents, and every MATMUL reads what the latest LOAD put there (the KV areas, above the slots, are
    the plan check's: test_compiler_verify)."""
    image = compile_model(meta_model("gpt2-124m"), get_config("u280", 2))
    for card, plan in zip(image.cards, image.meta["abuf"]):
        content, read = {}, {}
        for inst in card.program.instructions:
            if inst.opcode is Opcode.LOAD and inst.dst.space is Space.WBUF and inst.dst.offset < plan["kv_start"]:
                slot = inst.dst.offset
                assert content.get(slot) is None or read.get(slot), "slot reloaded before it was read"
                content[slot], read[slot] = inst.src1.offset, False
            elif inst.opcode is Opcode.MATMUL and inst.src2.offset < plan["kv_start"]:
                assert inst.src2.offset in content
                read[inst.src2.offset] = True


# --- programs ---------------------------------------------------------------------------------------

def test_programs_decode_validate_and_carry_the_config(tiny, tmp_path):
    cfg = get_config("u280", 4)
    image = compile_model(tiny, cfg, max_context=64)
    for index, card in enumerate(image.cards):
        program = card.program
        assert (program.config_name, program.config_hash) == (cfg.name, cfg.hash)
        assert (program.card, program.cards) == (index, 4)
        cfg.check_artifact("program", program.config_name, program.config_hash)
        assert program.instructions[-1].opcode is Opcode.HALT
        for inst in program.instructions:
            assert isinstance(inst, Instruction) and decode(inst.encode()) == inst
        registers = {inst.rd for inst in program.instructions if inst.unit.name == "CONTROL"}
        assert max(registers - {0}) < NUM_REGS
        assert Program.from_bytes(program.to_bytes()).instructions == program.instructions
    counts = [sum(i.opcode is Opcode.ALLGATHER for i in c.program.instructions) for c in image.cards]
    assert counts == [4 * 2] * 4  # four all-gathers per layer, the same on every card
    image.save(tmp_path / "image")
    loaded = ApplianceImage.load(tmp_path / "image")
    assert loaded.meta == image.meta and loaded.config == cfg
    for a, b in zip(loaded.cards, image.cards):
        assert a.program.instructions == b.program.instructions
        assert [addr for addr, _ in a.hbm_segments] == sorted(addr for addr, _ in b.hbm_segments)


def test_one_card_program_has_no_allgather_and_idle_cards_join_them(tiny):
    one = compile_model(tiny, get_config("u280", 1), max_context=64)
    assert not any(i.opcode is Opcode.ALLGATHER for i in one.cards[0].program.instructions)
    four = compile_model(load_model("synthetic:n_layer=1,n_embd=192,n_head=3,vocab_size=300"),
                         get_config("u280", 4), max_context=64)
    idle = four.cards[3].program.instructions  # 3 heads on 4 cards: card 3 has no attention work
    assert not any(i.opcode is Opcode.MASKED_QK for i in idle)
    assert sum(i.opcode is Opcode.ALLGATHER for i in idle) == 4


def test_projection_and_mlp_are_gathered_piece_by_piece():
    """On several cards each weight piece of the projection and the MLP layers is all-gathered right after its
    MATMUL (only weight LOADs between), from where the MATMUL wrote it, and the ring moves it while the matrix unit
    computes the next piece. GPT-2 1.5B's widths on 4 cards: one projection piece, two per MLP layer on every
    card."""
    image = compile_model(meta_model("n_layer=1,n_embd=1600,n_head=25,vocab_size=2048"), get_config("u280", 4))
    for card in image.cards:
        code = card.program.instructions
        gathers = [pc for pc, i in enumerate(code) if i.opcode is Opcode.ALLGATHER]
        assert len(gathers) == 1 + 1 + 2 + 2  # attention, projection, first and second MLP layer
        for pc in gathers[1:]:
            producer = next(at for at in range(pc - 1, -1, -1) if code[at].opcode is not Opcode.LOAD)
            matmul, gather = code[producer], code[pc]
            assert matmul.opcode is Opcode.MATMUL
            assert (gather.src1, gather.n, gather.src1_stride) == (matmul.dst, matmul.n, matmul.dst_stride)
    device = SimulatorDevice(image.config, compute=False)
    Appliance(device, image).run(32, [464])
    for report in device.last_report.cards:
        timeline = report.timeline
        gathers = [pc for pc, entry in enumerate(timeline) if entry[0] == "ALLGATHER"]
        # the first MLP layer's first exchange runs mostly during its second piece's MATMUL; the second MLP layer's
        # MATMUL waits for its exchange:
        # the scoreboard (hw/core/scoreboard.py, as the cycle model) takes an ALLGATHER's destination as [base, 2**32),
        # since the other cards' slices are unknown at issue, and that MATMUL writes above the gather's base
        for pc, overlaps in ((gathers[2], True), (gathers[4], False)):
            following = next(entry for entry in timeline[pc + 1:] if entry[0] == "MATMUL")
            (_, _, start, end), (_, _, m_start, m_end) = timeline[pc], following
            assert (min(end, m_end) - max(start, m_start) > (end - start) // 2) is overlaps


def test_gathered_slices_are_cut_alike_on_every_card():
    """Small weight slots (1,024 words, beside a KV area of 512) cut every all-gathered slice into several pieces:
    every card gathers as many, each of the pieces it computed (2 for the projection, 6 for each MLP layer), and the
    plan check passes."""
    config = small_config("sim-small", abuf_words=4096, wbuf_words=2560).with_cards(4)
    image = compile_model(meta_model("n_layer=1,n_embd=64,n_head=4,vocab_size=64"), config, max_context=16)
    for card in image.cards:
        gathered = [i.n.imm for i in card.program.instructions if i.opcode is Opcode.ALLGATHER]
        assert len(gathered) == 1 + 2 + 6 + 6
        assert (sum(gathered[1:3]), sum(gathered[3:9]), sum(gathered[9:])) == (16, 64, 16)


def test_image_meta_records_the_host_layout_and_model(tiny):
    image = compile_model(tiny, get_config("u280", 2), max_context=64)
    meta = image.meta
    assert meta["model"]["n_head"] == 3 and meta["max_context"] == 64
    assert meta["weights_hash"] and meta["eos_token_id"] == tiny.config.eos_token_id
    logits = meta["host"]["logits"]
    assert [e["vocab"] for e in logits] == [[0, 160], [160, 300]]
    for card, entry in zip(image.cards, logits):
        assert entry["offset"] >= meta["max_rows"] + meta["host"]["ids_offset"]
        count = entry["vocab"][1] - entry["vocab"][0]
        assert entry["chunk_max_offset"] >= entry["offset"] + count and entry["chunk_max_offset"] % 32 == 0
        assert card.host_words == entry["chunk_max_offset"] + -(-count // entry["chunk"])


@pytest.mark.parametrize("cards", [1, 3])
def test_cards_store_the_maxima_of_their_logits_chunks(cards):
    """After the LM head every card stores the maxima of its logits' chunks (the last one short) beside them:
    what the host's sampler reads to find the argmax and the top-k candidates."""
    from ringgpt.host.runtime import Appliance
    from ringgpt.host.reference.models import load_model
    from ringgpt.hw import numerics
    from ringgpt.sim.functional import SimulatorDevice
    image = compile_model(load_model("synthetic:n_layer=1,n_embd=64,n_head=2,vocab_size=1000", seed=3),
                          get_config("sim-small", cards), max_context=16)
    appliance = Appliance(SimulatorDevice(image.config), image)
    appliance.run(0, [5, 6, 7])
    for entry, (logits, maxima) in zip(image.meta["host"]["logits"], appliance.read_back()):
        chunk = entry["chunk"]
        assert logits.size == entry["vocab"][1] - entry["vocab"][0] and logits.size % chunk != 0
        want = [numerics.reduce_max(logits[i:i + chunk][None, :], axis=1)[0] for i in range(0, logits.size, chunk)]
        assert np.array_equal(maxima.view(np.uint16), np.float16(want).view(np.uint16))


@pytest.mark.parametrize("kwargs,match", [({"max_context": 2048}, "max_context=2048 must be in 1..1024"),
                                          ({"max_context": 0}, "max_context=0"),
                                          ({"wbuf_slots": 1}, "wbuf_slots=1"),
                                          ({"max_rows": 0}, "max_rows=0")])
def test_bad_options_are_clear_errors(tiny, kwargs, match):
    with pytest.raises(CompileError, match=match):
        compile_model(tiny, get_config("u280", 1), **kwargs)


def test_unsupported_gpt2_variants_are_rejected():
    model = meta_model("n_layer=1,n_embd=128,n_head=2,vocab_size=100")
    model.config.activation_function = "relu"
    with pytest.raises(CompileError, match="activation 'relu' is not supported"):
        compile_model(model, get_config("u280", 1), 64)
    model.config.activation_function = "gelu_new"
    model.config.scale_attn_by_inverse_layer_idx = True
    with pytest.raises(CompileError, match="attention scaling"):
        compile_model(model, get_config("u280", 1), 64)
