"""scripts/rtl_bisect.py's parts: the search for the first differing cut, the ABUF bounds a program prefix writes, and
the probe program (the prefix, a STORE of those bounds to the host, HALT). Its runs on the RTL are the script's."""
import pytest

from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.isa import Dim, Instruction, Opcode, Operand, Space
from ringgpt.hw.resolved import resolve_run

from device_checks import program_image

CONFIG = small_config("sim-small", abuf_words=4096, wbuf_words=2048)


@pytest.mark.parametrize("length, bad", [(1, 1), (7, 3), (100, 1), (100, 37), (100, 100), (300, 129), (50, None)])
def test_the_search_finds_the_first_differing_cut(load_script, length, bad):
    asked = []

    def differs(cut):
        asked.append(cut)
        return bad is not None and cut >= bad
    assert load_script("rtl_bisect").first_difference(differs, length) == bad
    assert len(asked) <= 2 * length.bit_length() + 2


def test_the_search_starts_past_a_cut_known_equal(load_script):
    asked = []

    def differs(cut):
        asked.append(cut)
        return cut >= 37
    assert load_script("rtl_bisect").first_difference(differs, 100, 8, good=32) == 37
    assert min(asked) > 32


def test_a_probe_stores_what_its_prefix_wrote(load_script):
    bisect = load_script("rtl_bisect")
    abuf = lambda offset: Operand(Space.ABUF, 0, offset)       # noqa: E731
    program = [Instruction.make(Opcode.LOAD, dst=abuf(100), src1=Operand(Space.HBM, 0, 0), rows=Dim(0, 1), n=Dim(0, 8)),
               Instruction.make(Opcode.VADD, dst=abuf(300), src1=abuf(100), src2=abuf(100), rows=Dim(0, 2),
                                n=Dim(0, 8), dst_stride=8, src1_stride=0, src2_stride=0),
               Instruction.make(Opcode.VEXP, dst=abuf(108), src1=abuf(300), rows=Dim(0, 1), n=Dim(0, 8)),
               Instruction.make(Opcode.HALT)]
    resolved = resolve_run(program, 0, 0, 1)
    chunk = CONFIG.buffer_chunk_words
    assert bisect.abuf_written(resolved[:1], chunk) == [(96, 112)]        # [100, 108) on 8-word chunks
    assert bisect.abuf_written(resolved[:2], chunk) == [(96, 112), (296, 320)]      # and [300, 316), apart
    assert bisect.abuf_written(resolved[:3], chunk) == [(96, 120), (296, 320)]      # [108, 116) merged with the first
    assert bisect.abuf_written([], chunk) == []
    image = program_image(CONFIG.with_cards(2), [program, [Instruction.make(Opcode.HALT)]])
    (probe, other), slots = bisect.probe_programs(image, 2, [(96, 112), (296, 320)], 64)
    assert probe.instructions[:2] == program[:2]
    assert [i.opcode for i in probe.instructions[2:]] == [Opcode.STORE, Opcode.STORE, Opcode.HALT]
    assert [(i.dst, i.src1, i.n.imm) for i in probe.instructions[2:4]] == [
        (Operand(Space.HOST, 0, 64), abuf(96), 16), (Operand(Space.HOST, 0, 80), abuf(296), 24)]
    assert slots == [(96, 112, 64), (296, 320, 80)]
    assert [i.opcode for i in other.instructions] == [Opcode.HALT]


def test_a_trace_stores_each_abuf_result_in_a_slot_of_its_own(load_script):
    bisect = load_script("rtl_bisect")
    abuf = lambda offset: Operand(Space.ABUF, 0, offset)       # noqa: E731
    program = [Instruction.make(Opcode.LOAD, dst=abuf(100), src1=Operand(Space.HBM, 0, 0), rows=Dim(0, 1), n=Dim(0, 8)),
               Instruction.make(Opcode.STORE, dst=Operand(Space.HBM, 0, 64), src1=abuf(100), rows=Dim(0, 1),
                                n=Dim(0, 8)),
               Instruction.make(Opcode.VADD, dst=abuf(300), src1=abuf(100), src2=abuf(100), rows=Dim(0, 2),
                                n=Dim(0, 8), dst_stride=8, src1_stride=0, src2_stride=0),
               Instruction.make(Opcode.VEXP, dst=abuf(8), src1=abuf(300), rows=Dim(0, 1), n=Dim(0, 8)),
               Instruction.make(Opcode.HALT)]
    resolved = resolve_run(program, 0, 0, 1)
    image = program_image(CONFIG.with_cards(2), [program, [Instruction.make(Opcode.HALT)]])
    (traced, other), slots = bisect.trace_programs(image, resolved, 1, 3, 64, CONFIG.buffer_chunk_words)
    # instruction 0 is before the span, 1 writes no ABUF, 2 writes [300, 316), 3 is past the span
    assert slots == [(2, 296, 320, 64)]
    assert traced.instructions[:3] == program[:3]
    store = traced.instructions[3]
    assert (store.opcode, store.dst, store.src1, store.n.imm) == (Opcode.STORE, Operand(Space.HOST, 0, 64),
                                                                  abuf(296), 24)
    assert [i.opcode for i in traced.instructions[4:]] == [Opcode.HALT]
    assert [i.opcode for i in other.instructions] == [Opcode.HALT]
    (traced, _), slots = bisect.trace_programs(image, resolved, 0, 4, 64, CONFIG.buffer_chunk_words)
    assert slots == [(0, 96, 112, 64), (2, 296, 320, 80), (3, 8, 16, 104)]
    assert [i.opcode for i in traced.instructions] == [Opcode.LOAD, Opcode.STORE, Opcode.STORE, Opcode.VADD,
                                                       Opcode.STORE, Opcode.VEXP, Opcode.STORE, Opcode.HALT]
