"""The compiler's plan check (host/compiler/verify.py): each invariant broken on purpose gives a PlanError that
names the card, the instruction and the region; the compiler's own programs pass; and the KV-area bug that gave
wrong logits at GPT-2's widths on one card is caught at compile time when the fix is taken out."""
import dataclasses

import pytest
import torch
from transformers import GPT2LMHeadModel

from ringgpt.host.compiler import build, compile_model, layout
from ringgpt.host.compiler.asm import Asm, abuf, hbm, host, imm, reg, wbuf
from ringgpt.host.compiler.verify import CardPlan, PlanError, verification_cases, verify_programs
from ringgpt.host.reference.models import load_model, size_config
from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Opcode

CFG = get_config("sim-small")
HBM_REGIONS = {"weights": (0, 4096), "KV cache L0": (4096, 8192)}
HOST_REGIONS = {"ids": (0, 8), "logits": (8, 72)}


def check(asm: Asm, cases=((0, 4),), hbm_words: int = 8192) -> None:
    verify_programs([CardPlan(asm.code, asm.flow, HBM_REGIONS, HOST_REGIONS, hbm_words, 72)], CFG, list(cases))


def two_loads_and_a_sum(asm: Asm) -> None:
    asm(Opcode.LOAD, dst=abuf(0), src1=hbm(0), rows=reg(2), n=16, dst_stride=16, src1_stride=16, writes="x",
        reads="weights")
    asm(Opcode.LOAD, dst=abuf(64), src1=hbm(64), rows=reg(2), n=16, dst_stride=16, src1_stride=16, writes="y",
        reads="weights")
    asm(Opcode.VADD, dst=abuf(128), src1=abuf(0), src2=abuf(64), rows=reg(2), n=16, dst_stride=16, src1_stride=16,
        src2_stride=16, writes="x+y", reads=("x", "y"))


def test_a_consistent_plan_passes():
    asm = Asm()
    two_loads_and_a_sum(asm)
    asm(Opcode.STORE, dst=host(8), src1=abuf(128), rows=1, n=16, writes="logits", reads="x+y")
    asm(Opcode.HALT)
    check(asm)


def test_reading_a_value_never_written_is_an_error():
    asm = Asm()
    asm(Opcode.VEXP, dst=abuf(0), src1=abuf(256), rows=1, n=8, writes="e", reads="scores")
    with pytest.raises(PlanError, match=r"card 0, instruction 0 \(VEXP.*src1 should read 'scores' but ABUF word 256 "
                                        r"\(row 0, column 0\) holds '\(nothing\)'"):
        check(asm)


def test_reading_another_value_names_its_writer():
    asm = Asm()
    two_loads_and_a_sum(asm)
    asm(Opcode.VEXP, dst=abuf(200), src1=abuf(0), rows=1, n=16, writes="e", reads="y")  # y is at 64, not 0
    with pytest.raises(PlanError, match=r"instruction 3 .*src1 should read 'y' but ABUF word 0 \(row 0, column 0\) "
                                        r"holds 'x', written by instruction 0 \(LOAD"):
        check(asm)


def test_overwriting_a_live_value_names_both_and_the_reader():
    asm = Asm()
    asm(Opcode.LOAD, dst=abuf(0), src1=hbm(0), rows=1, n=16, writes="x", reads="weights")
    asm(Opcode.LOAD, dst=abuf(8), src1=hbm(64), rows=1, n=16, writes="y", reads="weights")  # over x's tail
    asm(Opcode.VEXP, dst=abuf(100), src1=abuf(0), rows=1, n=16, writes="e", reads="x")
    with pytest.raises(PlanError, match=r"instruction 1 .*dst writes 'y' over ABUF word 8, which holds 'x', still "
                                        r"read by instruction 2 \(VEXP.*two live regions overlap"):
        check(asm)


def test_a_weight_slot_loaded_before_its_last_reader_is_an_error():
    asm = Asm()
    asm(Opcode.LOAD, dst=abuf(0), src1=hbm(0), rows=1, n=8, writes="x", reads="weights")
    asm(Opcode.LOAD, dst=wbuf(0), src1=hbm(256), rows=1, n=72, writes="piece 0", reads="weights")
    asm(Opcode.LOAD, dst=wbuf(0), src1=hbm(512), rows=1, n=72, writes="piece 2", reads="weights")  # too early
    asm(Opcode.MATMUL, dst=abuf(64), src1=abuf(0), src2=wbuf(0), aux=wbuf(64), rows=1, n=8, k=8, dst_stride=8,
        src1_stride=8, src2_stride=8, writes="out", reads=("x", "piece 0", "piece 0"))
    with pytest.raises(PlanError, match=r"instruction 2 .*writes 'piece 2' over WBUF word 0, which holds 'piece 0', "
                                        r"still read by instruction 3 \(MATMUL"):
        check(asm)


@pytest.mark.parametrize("load,problem", [
    ({"dst": abuf(4), "src1": hbm(0), "rows": 1, "n": 16}, r"dst - src1 = 4: not multiples of 8"),
    ({"dst": abuf(0), "src1": hbm(0), "rows": reg(2), "n": 16, "dst_stride": 16, "src1_stride": 20},
     r"dst_stride - src1_stride = -4: not multiples of 8")])
def test_a_transfer_that_shifts_words_within_the_beat_is_an_error(load, problem):
    """A LOAD from HBM whose words would land at other offsets within sim-small's 8-word beat
    (hw/resolved.misaligned_transfer; the RTL refuses it) stops the compile."""
    asm = Asm()
    asm(Opcode.LOAD, **load, writes="x", reads="weights")
    with pytest.raises(PlanError, match=rf"card 0, instruction 0 \(LOAD.*{problem}"):
        check(asm)


def test_weights_off_their_boundaries_are_an_error():
    """A MATMUL whose weights start off a weight_align boundary (hw/resolved.misaligned_weights) stops the compile."""
    asm = Asm()
    asm(Opcode.LOAD, dst=abuf(0), src1=hbm(0), rows=1, n=8, writes="x", reads="weights")
    asm(Opcode.LOAD, dst=wbuf(0), src1=hbm(256), rows=1, n=72, writes="piece", reads="weights")
    asm(Opcode.MATMUL, dst=abuf(64), src1=abuf(0), src2=wbuf(4), rows=1, n=8, k=4, dst_stride=8, src1_stride=8,
        src2_stride=8, writes="out", reads=("x", "piece"))
    with pytest.raises(PlanError, match=r"instruction 2 \(MATMUL.*src2\) at WBUF word 4 .* not on 8-word boundaries"):
        check(asm)


def test_vector_operands_off_their_boundaries_are_an_error():
    """A VADD whose src1 starts off a vector_align boundary (hw/resolved.misaligned_vector) stops the compile; one
    word a row may lie anywhere."""
    asm = Asm()
    asm(Opcode.LOAD, dst=abuf(0), src1=hbm(0), rows=1, n=24, writes="x", reads="weights")
    asm(Opcode.VADD, dst=abuf(100), src1=abuf(3), src2=imm(1.0), rows=1, n=1, writes="one", reads="x")
    asm(Opcode.VADD, dst=abuf(64), src1=abuf(4), src2=imm(1.0), rows=1, n=8, writes="y", reads="x")
    with pytest.raises(PlanError, match=r"instruction 2 \(VADD.*src1 at ABUF word 4 is not on 8-word boundaries"):
        check(asm)


def test_addresses_outside_their_space_or_region_are_errors():
    asm = Asm()
    asm(Opcode.LOAD, dst=abuf(0), src1=hbm(0), rows=1, n=8, writes="x", reads="weights")
    asm(Opcode.VEXP, dst=abuf(CFG.abuf_words - 4), src1=abuf(0), rows=1, n=8, writes="e", reads="x")
    with pytest.raises(PlanError, match=rf"dst writes ABUF words \[{CFG.abuf_words - 4}, {CFG.abuf_words + 4}\) "
                                        rf"outside the space \({CFG.abuf_words} words\)"):
        check(asm)
    asm = Asm()
    asm(Opcode.LOAD, dst=abuf(0), src1=hbm(4000), rows=reg(2), n=32, dst_stride=32, src1_stride=32, writes="x",
        reads="weights")
    with pytest.raises(PlanError, match=r"src1 reads HBM words \[4000, 4128\), outside region 'weights' \[0, 4096\)"):
        check(asm)


def test_register_dependent_extents_are_checked_for_every_case():
    """The KV cache STORE is within its region for the first run and past it for the last position."""
    asm = Asm()
    asm(Opcode.LOAD, dst=abuf(0), src1=hbm(0), rows=reg(2), n=64, dst_stride=64, src1_stride=64, writes="kv",
        reads="weights")
    asm(Opcode.STORE, dst=hbm(4096, 1), src1=abuf(0), rows=reg(2), n=64, dst_stride=64, src1_stride=64,
        writes="KV cache L0", reads="kv")
    check(asm, [(0, 4)])
    with pytest.raises(PlanError, match=r"run pos=4092 rows=4: dst writes HBM words \[8188, 8444\), outside region "
                                        r"'KV cache L0' \[4096, 8192\)"):
        check(asm, verification_cases(4096, 4), hbm_words=16384)


def test_a_dataflow_statement_that_misses_an_operand_is_an_error():
    asm = Asm()
    asm(Opcode.VADD, dst=abuf(0), src1=abuf(0), src2=imm(1.0), rows=1, n=8, writes="x", reads=("x", "one"))
    with pytest.raises(PlanError, match=r"its dataflow names 2 reads and 1 writes for 1 read and 1 written operands"):
        check(asm)


@pytest.mark.parametrize("flag", ["one_kv_area", "one_score_area"])
def test_the_shared_area_bug_is_a_compile_error_without_its_fix(monkeypatch, flag):
    """GPT-2 124M's widths on one u280 card, in two head groups of 6 that share one KV area (the planner's choice
    where two areas do not fit the weight buffer's KV share; forced here), and, with plans that have one score
    area, one score area between heads. Without the flush of the pending head's weighted sum
    (the bug that gave 0.4 relative RMS logits error), the plan check stops the compile."""
    with torch.device("meta"):
        model = GPT2LMHeadModel(size_config("gpt2-124m"))
    config = get_config("u280", 1)
    kv = layout.choose_kv                   # two groups of 6 heads in one KV area
    monkeypatch.setattr(layout, "choose_kv", lambda *a, **k: dataclasses.replace(kv(*a, **k), areas=1))
    if flag == "one_score_area":
        plans = layout.choose_abuf_plans
        monkeypatch.setattr(layout, "choose_abuf_plans",
                            lambda *a, **k: [dataclasses.replace(p, score_areas=1) for p in plans(*a, **k)])
    image = compile_model(model, config, kv_group=6)
    assert image.meta["abuf"][0]["kv_areas"] == 1 and image.meta["abuf"][0]["kv_group"] == 6
    monkeypatch.setattr(build.CardBuilder, flag, property(lambda self: False))
    value = "Vt g0" if flag == "one_kv_area" else r"head \d+ scores"
    space = "WBUF" if flag == "one_kv_area" else "ABUF"
    with pytest.raises(PlanError, match=rf"card 0, instruction \d+ .*over {space} word \d+, which holds 'L0\.{value}', "
                                        r"still read by instruction \d+ \(MATMUL.*two live regions overlap"):
        compile_model(model, config, kv_group=6)


def test_probes_name_every_sub_block_in_program_order():
    model = load_model("synthetic:n_layer=2,n_embd=192,n_head=3,vocab_size=256", seed=1)
    image = compile_model(model, get_config("u280", 2), max_context=32)
    per_layer = ["ln1", "qkv", "attn", "proj", "res1", "ln2", "fc", "fc2", "res2"]
    want = ["embed"] + [f"L{i}.{n}" for i in range(2) for n in per_layer] + ["ln_f", "logits"]
    for card, probes in enumerate(image.meta["probes"]):
        assert [p["name"] for p in probes] == want
        assert [p["pc"] for p in probes] == sorted(p["pc"] for p in probes)
        qkv = next(p for p in probes if p["name"] == "L0.qkv")
        heads = image.meta["partition"]["heads"][card]
        assert qkv["segments"][2] == [heads[0] * 64, heads[1] * 64, 2 * (heads[1] - heads[0]) * 64, 0.125]


def test_a_streaming_unit_may_write_in_place_but_not_over_another_source():
    asm = Asm()
    two_loads_and_a_sum(asm)
    asm(Opcode.VADD, dst=abuf(0), src1=abuf(0), src2=abuf(64), rows=reg(2), n=16, dst_stride=16, src1_stride=16,
        src2_stride=16, writes="x2", reads=("x", "y"))  # exactly in place over src1: allowed
    asm(Opcode.VADD, dst=abuf(60), src1=abuf(128), src2=abuf(64), rows=reg(2), n=16, dst_stride=16,
        src1_stride=16, src2_stride=16, writes="y2", reads=("x+y", "y"))  # shifted over src2
    with pytest.raises(PlanError, match=r"instruction 4 .*dst shares ABUF word 64 with its own src2: a streaming "
                                        r"unit may only write exactly in place over src1"):
        check(asm)
