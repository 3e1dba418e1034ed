"""scripts/alignment_census.py: buffer blocks sorted into the kinds a buffer port serves (aligned to the chunk, one
word per row, the DMA engines' side, misaligned), on hand-made instructions whose kinds are known."""
import importlib.util
from pathlib import Path

from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Flags, Opcode, Space
from ringgpt.hw.resolved import Resolved, access_blocks

_spec = importlib.util.spec_from_file_location(
    "alignment_census", Path(__file__).resolve().parents[1] / "scripts" / "alignment_census.py")
census_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(census_script)

CFG = get_config("u280")
C = CFG.buffer_chunk_words


def kinds(r: Resolved) -> dict:
    """{operand: kind} of the instruction's buffer blocks."""
    reads, writes = access_blocks(r)
    return {b.operand: census_script.kind(r, b, C) for b in (*reads, *writes)
            if b.space in census_script.BUFFERS}


def test_blocks_sort_into_their_kinds():
    matmul = Resolved(Opcode.MATMUL, rows=2, n=3 * C, k=C, dst=(Space.ABUF, 5 * C), src1=(Space.ABUF, 0),
                      src2=(Space.WBUF, 0), aux=(Space.WBUF, C), dst_stride=4 * C, src1_stride=C, src2_stride=C)
    assert kinds(matmul) == dict.fromkeys(("src1", "src2", "aux", "dst"), "aligned")
    assert kinds(matmul._replace(dst=(Space.ABUF, 5 * C + 16)))["dst"] == "misaligned"       # first word
    assert kinds(matmul._replace(dst_stride=4 * C + 1))["dst"] == "misaligned"               # row stride
    assert kinds(matmul._replace(rows=1, dst_stride=4 * C + 1))["dst"] == "aligned"          # one row: no stride
    vsum = Resolved(Opcode.VSUM, rows=4, n=C, dst=(Space.ABUF, 7), src1=(Space.ABUF, 0), dst_stride=3,
                    src1_stride=C)
    assert kinds(vsum) == {"src1": "aligned", "dst": "single"}
    load = Resolved(Opcode.LOAD, rows=1, n=100, dst=(Space.WBUF, 32), src1=(Space.HBM, 32))
    assert kinds(load) == {"dst": "engine"}
    copy = load._replace(src1=(Space.ABUF, 3))
    assert kinds(copy) == {"src1": "misaligned", "dst": "misaligned"}
    store = Resolved(Opcode.STORE, rows=1, n=100, dst=(Space.HOST, 0), src1=(Space.ABUF, 3), flags=Flags())
    assert kinds(store) == {"src1": "engine"}


def test_census_counts_every_buffer_block_once_per_card():
    vsum = Resolved(Opcode.VSUM, rows=4, n=C, dst=(Space.ABUF, 7), src1=(Space.ABUF, 0), dst_stride=3,
                    src1_stride=C)
    bad = Resolved(Opcode.MATMUL, rows=1, n=C, k=C, dst=(Space.ABUF, 1), src1=(Space.ABUF, 0),
                   src2=(Space.WBUF, 0), aux=(Space.NONE, 0), src1_stride=C, src2_stride=C)
    counts, found = census_script.census([[vsum, bad], [vsum]], CFG)
    assert counts[("VSUM", "dst", "ABUF")] == {"single": 2}
    assert counts[("VSUM", "src1", "ABUF")] == {"aligned": 2}
    assert counts[("MATMUL", "dst", "ABUF")] == {"misaligned": 1}
    assert found == [{"card": 0, "op": "MATMUL", "operand": "dst", "space": "ABUF", "base": 1, "rows": 1, "cols": C,
                      "stride": 0}]


def test_compiled_gpt2_width_programs_address_the_buffers_on_chunks():
    # GPT-2 124M's widths and vocabulary (one layer): the LM head's pieces start on buffer chunks
    # (compiler.layout.lm_head_align; in the matrix unit's 16-column groups, pieces of 2,288 columns: 30 misaligned
    # blocks a run on one card)
    for cards in (1, 2):
        cfg = get_config("u280", cards)
        traces = census_script.run_traces("n_layer=1,n_embd=768,n_head=12", cfg, prompt=2, max_context=64)
        counts, found = census_script.census(traces, cfg)
        assert found == []
        assert counts[("MATMUL", "dst", "ABUF")]["aligned"] > 20 * cards
