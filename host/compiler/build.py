"""compile_model: a GPT-2 model and an architecture config in, an appliance image out (one row-generic
program per card, each card's HBM contents, the host layout). See docs/compiler.md."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ringgpt.host.compiler.asm import Asm, abuf, hbm, host, imm, reg, wbuf
from ringgpt.host.compiler.errors import CompileError
from ringgpt.host.compiler.layout import (LOGIT_CHUNK, STAT_WORDS, AbufPlan, KVArea, Piece, Stat, align_up, card_hbm,
                                          activation_row, chunk_count, gathered_pieces, kv_cache_words, layer_stream,
                                          layer_widths, lm_head_align, lm_head_words, ln_block, pack_slice,
                                          plan_buffers,
                                          region_align, score_row, stream_align, weight_stride)
from ringgpt.host.compiler.model import LayerWeights, ModelDims, fp16, has_weights, lm_head_int8, lm_head_tied
from ringgpt.host.compiler.partition import Partition, model_partition, split
from ringgpt.host.compiler.verify import CardPlan, verification_cases, verify_programs
from ringgpt.host.image import ApplianceImage, CardImage
from ringgpt.host.reference.models import check_weights, weights_hash
from ringgpt.host.reference.spec import token_id_problem
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import HOST_POS_REG, HOST_ROWS_REG, NUM_REGS, Opcode
from ringgpt.hw.numerics import WEIGHT_FORMATS
from ringgpt.hw.program import Program

COMPILER_VERSION = 3
"""Recorded in the image meta; bumped when the image layout changes incompatibly."""
DEFAULT_WBUF_SLOTS = 2
"""Weight-buffer slots the stream rotates through: the DMA fills one while the matrix unit reads the other."""

POS, ROWS = HOST_POS_REG, HOST_ROWS_REG
TOKENS = 3
"""R3 = pos + rows: the keys visible to the run's last token."""
POS_KV = 4
"""R4 = pos * key_width (local_heads * key_words): the first new row of the layer's K cache."""
POS_D = 5
"""R5 = pos * activation_row: the first position-embedding row."""
LAST_ROW = 6
"""R6 = (rows - 1) * activation_row: the last token's row of the residual stream."""
FIRST_FREE_REG = 7
"""R7 and up: pos * width for each head-group width (the first new row of a KV area's K)."""

class WeightStream:
    """Emits the pieces' LOADs into the ring of weight-buffer slots (piece i goes to slot i mod S). A LOAD may
    be emitted once the MATMUL of piece i - S (the slot's previous reader) has been."""

    def __init__(self, asm: Asm, pieces: list, slot_words: int, slots: int):
        self.asm, self.pieces, self.slot_words, self.slots = asm, pieces, slot_words, slots
        self.loaded = 0
        self.used = 0
        self.hold = len(pieces)
        """fill() emits no LOAD of this piece or later (other DMA work is to be queued before them)."""

    def slot(self, index: int) -> int:
        return (index % self.slots) * self.slot_words

    def fill(self, ahead: int | None = None) -> None:
        """Emits the next LOADs, up to `ahead` pieces past the next one to be read (default: all slots) and,
        unless `ahead` is given, not past the hold."""
        limit = self.used + (self.slots if ahead is None else min(ahead, self.slots))
        if ahead is None:
            limit = min(limit, self.hold)
        while self.loaded < min(limit, len(self.pieces)):
            piece = self.pieces[self.loaded]
            self.asm(Opcode.LOAD, dst=wbuf(self.slot(self.loaded)), src1=hbm(piece.hbm), rows=1, n=piece.words,
                     writes=piece.name, reads=piece.hbm_region)
            self.loaded += 1

    def take(self) -> tuple[Piece, int]:
        """The next piece and its weight-buffer address (its LOAD emitted first if it was not yet)."""
        self.fill(1)
        self.used += 1
        return self.pieces[self.used - 1], self.slot(self.used - 1)


class CardBuilder:
    """Lays out one card's HBM and emits its program."""

    def __init__(self, ctx: "Context", card: int):
        self.ctx, self.card = ctx, card
        dims = ctx.dims
        self.plan: AbufPlan = ctx.plans[card]
        self.h0, self.h1 = ctx.partition.heads[card]
        self.e0, self.e1 = ctx.partition.embd[card]
        self.f0, self.f1 = ctx.partition.ffn[card]
        self.v0, self.v1 = ctx.partition.vocab[card]
        self.local_heads = self.h1 - self.h0
        hd, d = dims.head_dim, dims.n_embd
        self.kv_width = self.local_heads * hd
        """W: the local heads' K (or V) columns. The QKV block is [K | V | Q], 3W wide: K and V are computed
        first, so appending them to the KV cache overlaps the Q columns' matrix work."""
        heads_cols = np.arange(self.h0 * hd, self.h1 * hd)
        self.columns = [np.concatenate([d + heads_cols, 2 * d + heads_cols, heads_cols]),
                        np.arange(self.e0, self.e1), np.arange(self.f0, self.f1), np.arange(self.e0, self.e1)]
        groups = -(-self.local_heads // self.plan.kv_group) if self.local_heads else 0
        self.groups = split(self.local_heads, groups) if groups else ()
        self.kv_area = KVArea(hd, ctx.max_context, self.plan.kv_group, region_align(ctx.config))
        """Where a head group's keys and V^T lie in a KV area (their columns on weight_align boundaries, and on the
        beat's: region_align)."""
        self.key_width = self.kv_area.key_row(self.local_heads)
        """Words of a K-cache row in HBM: the local heads' keys in the KV areas' slots (head h at h * key_words),
        so that a head group's keys load with HBM and KV-area words at the same offsets within the beat."""
        self._layout()

    # --- HBM ------------------------------------------------------------------------------------
    def _layout(self) -> None:
        ctx, dims, tmax = self.ctx, self.ctx.dims, self.ctx.max_context
        config, d = ctx.config, dims.n_embd
        self.d_stride = weight_stride(d, config.weight_align)        # wte's rows: the tied LM head's columns
        self.row = activation_row(d, config)                         # X, H, T's rows, wpe's, LayerNorm vectors
        self.score_row = score_row(tmax, config)                     # a head's scores
        self.ln_block = ln_block(d, config)                          # a layer's LayerNorm parameters
        stream = layer_stream(config, layer_widths(dims, ctx.partition, self.card), ctx.slot_words,
                              {index: spans[self.card] for index, spans in ctx.gathered_pieces.items()}, ctx.int8)
        self.stream_words = stream.words(dims.n_layer)
        vocab = self.v1 - self.v0
        m = self.hbm = card_hbm(config, dims, self.card, tmax, self.stream_words,
                                None if ctx.tied else lm_head_words(config, d, vocab, ctx.int8, ctx.slot_words),
                                kv_cache_words(config, dims, tmax, self.local_heads, self.plan.kv_group))
        self.wte, self.wpe, self.ln = m.start("wte"), m.start("wpe"), m.start("layernorm")
        self.stream_start = m.start("layer weights")
        self.pieces = [p for layer in range(dims.n_layer) for p in stream.of_layer(layer, self.stream_start)]
        self.lm_head = self.wte + self.v0 * self.d_stride if ctx.tied else m.start("lm_head")
        pack_slice(self.pieces, self.lm_head, vocab, d, config, ctx.int8, False, (dims.n_layer, 0, 0),
                   ctx.slot_words, lm_head_align(config), "wte" if ctx.tied else "lm_head",
                   piece_align=1 if ctx.tied else stream_align(config))
        self.kv = [m.start(f"KV cache L{layer}") if self.local_heads else None for layer in range(dims.n_layer)]
        m.check_capacity(tmax)

    def new_segments(self) -> None:
        """Allocates the card's HBM contents (filled by fill_layer and segments)."""
        dims = self.ctx.dims
        self.ln_data = np.zeros(dims.n_layer * self.ln_block + 2 * self.row, np.float16)
        self.stream_data = np.zeros(self.stream_words, np.float16)

    def fill_layer(self, layer: int, w: LayerWeights) -> None:
        at, d = layer * self.ln_block, self.ctx.dims.n_embd
        for index, vector in enumerate([*w.ln1, *w.ln2]):            # gamma, beta of ln_1, then of ln_2
            self.ln_data[at + index * self.row:][:d] = vector
        tensors = (w.qkv, w.proj, w.fc, w.fc2)
        for piece in self.pieces:
            piece_layer, index, col = piece.origin
            if piece_layer != layer:
                continue
            weight, bias = tensors[index]
            cols = self.columns[index][col:col + piece.cols]
            start = piece.hbm - self.stream_start
            self.stream_data[start:start + piece.words] = self._piece(piece, weight, cols, bias[cols])

    @staticmethod
    def _piece(piece, weight, cols, bias) -> np.ndarray:
        """Piece.image of columns `cols` of `weight`: FP16 (in, out), or INT8's (q, scale)."""
        if piece.int8:
            q, scale = weight
            return piece.image(q[:, cols].T, bias, scale[cols])
        return piece.image(weight[:, cols].T, bias)

    def segments(self, wte: np.ndarray, wpe: np.ndarray, ln_f: np.ndarray, lm_head) -> list:
        """(word address, FP16 array) pairs: the card's HBM contents at load (`lm_head`: None when tied to wte, else
        its FP16 (vocab, n_embd) weights or INT8's (q, scale) of its columns)."""
        at, d = self.ctx.dims.n_layer * self.ln_block, self.ctx.dims.n_embd
        for index, vector in enumerate(ln_f.reshape(2, d)):          # gamma, beta
            self.ln_data[at + index * self.row:][:d] = vector
        segments = [(self.wte, self._rows(wte, self.d_stride)),
                    (self.wpe, self._rows(wpe[:self.ctx.max_context], self.row)),
                    (self.ln, self.ln_data), (self.stream_start, self.stream_data)]
        if lm_head is not None:
            head = lm_head if self.ctx.int8 else lm_head.T
            segments += [(p.hbm, self._piece(p, head, np.arange(self.v0, self.v1)[p.origin[2]:][:p.cols], None))
                         for p in self.pieces if p.hbm_region == "lm_head"]
        return [(addr, arr) for addr, arr in segments if arr.size]

    @staticmethod
    def _rows(table: np.ndarray, stride: int) -> np.ndarray:
        """A table's rows (rows x d) as HBM holds them: `stride` words apart, zero between."""
        out = np.zeros((table.shape[0], stride), np.float16)
        out[:, :table.shape[1]] = table
        return out.ravel()

    # --- the program ----------------------------------------------------------------------------
    def program(self) -> list:
        """The card's program; its dataflow is in self.asm.flow and its probes in self.probes."""
        ctx, dims, plan = self.ctx, self.ctx.dims, self.plan
        d, n_inner = dims.n_embd, dims.n_inner
        a = self.asm = Asm()
        self.probes = []
        self.stream = WeightStream(a, self.pieces, ctx.slot_words, ctx.slots)
        self._registers()
        # Embedding: token rows gathered by id into X, plus the position rows from pos on into T, both a row apart
        # (activation_row: whole HBM beats).
        r, hr = self.row, activation_row(n_inner, ctx.config)
        a(Opcode.GATHER, dst=abuf(plan["X"]), src1=hbm(self.wte), src2=host(ctx.ids_offset), rows=reg(ROWS), n=d,
          dst_stride=r, src1_stride=self.d_stride, writes="token rows", reads=("wte", "ids"))
        a(Opcode.LOAD, dst=abuf(plan["T"]), src1=hbm(self.wpe, POS_D), rows=reg(ROWS), n=d, dst_stride=r,
          src1_stride=r, writes="position rows", reads="wpe")
        self._load_ln_params(0)
        a(Opcode.LOAD, dst=abuf(plan["LNFP"]), src1=hbm(self.ln + dims.n_layer * self.ln_block), rows=1, n=2 * r,
          writes="ln_f params", reads="layernorm")
        self.stream.fill()
        self._vector(Opcode.VADD, plan["X"], plan["X"], plan["T"], d, "embed", ("token rows", "position rows"))
        self._probe("embed", plan["X"], d, stride=r)
        self.area_counter = 0
        residual = "embed"
        for layer in range(dims.n_layer):
            L = f"L{layer}."
            lnp = plan["LNP"] + (layer % 2) * self.ln_block
            self._layernorm(plan["X"], 0, residual, plan["H"], L + "ln1", reg(ROWS), lnp, L + "ln params",
                            plan["S"])
            if layer + 1 < dims.n_layer:
                self._load_ln_params(layer + 1)
            first_area = self._attention_inputs(layer, 0) if self.local_heads else None
            if self.local_heads:
                # Queue the KV-cache traffic right behind the load after the last K|V columns' load.
                kv_last = max(i for i, p in enumerate(self.pieces)
                              if p.origin[:2] == (layer, 0) and p.origin[2] < 2 * self.kv_width)
                self.stream.hold = kv_last + 2
            self._linear((layer, 0), plan["H"], L + "ln1", r, plan["QKV"], L + "qkv", 3 * self.kv_width)
            if self.local_heads:
                self._probe(L + "qkv", plan["QKV"], 3 * self.kv_width, segments=self._qkv_segments())
                self._append_kv(layer)
                self._attention(layer, first_area)
            self._allgather(plan["BIG"], L + "attn", r, self.h0 * dims.head_dim, self.h1 * dims.head_dim)
            self._probe(L + "attn", plan["BIG"], d, stride=r)
            # Per-piece all-gathers stage a card's later pieces where nothing live is: in H (a LayerNorm output)
            # once its last reader, the QKV or the first MLP layer's MATMUL, is issued; in T after LayerNorm 2.
            self._gathered_linear((layer, 1), plan["BIG"], L + "attn", r, plan["T"], L + "proj", r, self.e0,
                                  plan["H"])
            self._probe(L + "proj", plan["T"], d, stride=r)
            self._vector(Opcode.VADD, plan["X"], plan["X"], plan["T"], d, L + "res1", (residual, L + "proj"))
            self._probe(L + "res1", plan["X"], d, stride=r)
            self._layernorm(plan["X"], 0, L + "res1", plan["H"], L + "ln2", reg(ROWS), lnp + 2 * r,
                            L + "ln params", plan["S"])
            self._gathered_linear((layer, 2), plan["H"], L + "ln2", r, plan["BIG"], L + "fc", hr, self.f0,
                                  plan["T"], gelu=True)
            self._probe(L + "fc", plan["BIG"], n_inner, stride=hr)
            self._gathered_linear((layer, 3), plan["BIG"], L + "fc", hr, plan["T"], L + "fc2", r, self.e0,
                                  plan["H"])
            self._probe(L + "fc2", plan["T"], d, stride=r)
            residual = L + "res2"
            self._vector(Opcode.VADD, plan["X"], plan["X"], plan["T"], d, residual, (L + "res1", L + "fc2"))
            self._probe(residual, plan["X"], d, stride=r)
        # The last token only: final LayerNorm, this card's slice of the LM head, logits to the host.
        self._layernorm(plan["X"], LAST_ROW, residual, plan["LNF"], "ln_f", 1, plan["LNFP"], "ln_f params",
                        plan["SF"])
        vocab = self.v1 - self.v0
        self._linear((dims.n_layer, 0), plan["LNF"], "ln_f", r, plan["LOGITS"], "logits", vocab, rows=1)
        if vocab:
            self._probe("logits", plan["LOGITS"], vocab, rows="last", segments=[[self.v0, self.v1, 0, 1.0]])
            a(Opcode.STORE, dst=host(ctx.logits_offset), src1=abuf(plan["LOGITS"]), rows=1, n=vocab,
              writes="logits", reads="logits")
            self._chunk_maxima(vocab)
        a(Opcode.HALT)
        return a.code

    @property
    def chunk_max_offset(self) -> int:
        """Host-buffer word where this card's chunk maxima follow its logits (aligned like the logits)."""
        return align_up(self.ctx.logits_offset + self.v1 - self.v0, self.ctx.config.beat_words)

    def _chunk_maxima(self, vocab: int) -> None:
        """The maxima of the logits' chunks of LOGIT_CHUNK (the last one short), stored after the logits."""
        a, logits, maxima = self.asm, self.plan["LOGITS"], self.plan["CHUNK_MAX"]
        full, tail = divmod(vocab, LOGIT_CHUNK)
        if full:
            a(Opcode.VMAX, dst=abuf(maxima), src1=abuf(logits), rows=full, n=LOGIT_CHUNK, dst_stride=1,
              src1_stride=LOGIT_CHUNK, writes="chunk maxima", reads="logits")
        if tail:
            a(Opcode.VMAX, dst=abuf(maxima + full), src1=abuf(logits + full * LOGIT_CHUNK), rows=1, n=tail,
              dst_stride=1, src1_stride=tail, writes="chunk maxima", reads="logits")
        a(Opcode.STORE, dst=host(self.chunk_max_offset), src1=abuf(maxima), rows=1, n=full + bool(tail),
          writes="chunk maxima", reads="chunk maxima")

    def _probe(self, name: str, addr: int, width: int, rows: str = "run", segments: list | None = None,
               stride: int | None = None) -> None:
        """Records where value `name` can be observed: after the last instruction that writes it (so far),
        the run's rows ("run") or its last token ("last") at ABUF `addr`, `width` words a row, `stride` (default
        `width`) from one row to the next; `segments` map ABUF columns to reference columns: [ref_start, ref_stop,
        column offset, scale]."""
        pc = max((i for i, f in enumerate(self.asm.flow) if name in f.writes), default=None)
        if pc is not None:
            self.probes.append({"name": name, "pc": pc, "addr": addr, "rows": rows, "stride": stride or width,
                                "width": width, "segments": segments or [[0, width, 0, 1.0]]})

    def _qkv_segments(self) -> list:
        """The QKV block's columns [K | V | Q] in the reference's c_attn output (Q | K | V), Q pre-scaled."""
        d, hd, w = self.ctx.dims.n_embd, self.ctx.dims.head_dim, self.kv_width
        lo, hi = self.h0 * hd, self.h1 * hd
        return [[d + lo, d + hi, 0, 1.0], [2 * d + lo, 2 * d + hi, w, 1.0], [lo, hi, 2 * w, self.ctx.dims.q_scale]]

    def _registers(self) -> None:
        a = self.asm
        a(Opcode.ADD, rd=TOKENS, rs=POS, rt=ROWS)
        a(Opcode.MULI, rd=POS_KV, rs=POS, imm=self.key_width)
        a(Opcode.MULI, rd=POS_D, rs=POS, imm=self.row)
        a(Opcode.MULI, rd=LAST_ROW, rs=ROWS, imm=self.row)
        a(Opcode.ADDI, rd=LAST_ROW, rs=LAST_ROW, imm=-self.row)
        self.width_reg = {}
        for start, stop in self.groups:
            width = self.kv_area.key_row(stop - start)
            if width not in self.width_reg:
                number = FIRST_FREE_REG + len(self.width_reg)
                assert number < NUM_REGS
                self.width_reg[width] = number
                a(Opcode.MULI, rd=number, rs=POS, imm=width)

    def _load_ln_params(self, layer: int) -> None:
        block = self.ln_block
        self.asm(Opcode.LOAD, dst=abuf(self.plan["LNP"] + (layer % 2) * block), src1=hbm(self.ln + layer * block),
                 rows=1, n=4 * self.row, writes=f"L{layer}.ln params", reads="layernorm")

    def _vector(self, opcode: Opcode, dst: int, src1: int, src2: int, width: int, writes: str, reads: tuple) -> None:
        """dst = src1 (op) src2 over rows x width, all with row stride activation_row."""
        self.asm(opcode, dst=abuf(dst), src1=abuf(src1), src2=abuf(src2), rows=reg(ROWS), n=width,
                 dst_stride=self.row, src1_stride=self.row, src2_stride=self.row, writes=writes, reads=reads)

    def _layernorm(self, src: int, src_reg: int, src_name: str, dst: int, name: str, rows, params: int,
                   params_name: str, stats: int) -> None:
        """dst (value `name`) = LayerNorm(src) with gamma, beta at params, params + activation_row; plan["T"] is
        scratch; every row activation_row words from the last."""
        a, d, r, sw = self.asm, self.ctx.dims.n_embd, self.row, STAT_WORDS
        scratch, eps = self.plan["T"], self.ctx.dims.layer_norm_epsilon
        mean, var, rstd = abuf(stats + Stat.MEAN), abuf(stats + Stat.VAR), abuf(stats + Stat.RSTD)
        centred, var_name, rstd_name = f"{name} centred", f"{name} var", f"{name} rstd"
        row_scalar = {"src2_row_scalar": 1}
        a(Opcode.VDOT, dst=mean, src1=abuf(src, src_reg), src2=imm(1.0 / d), rows=rows, n=d, dst_stride=sw,
          src1_stride=r, writes=f"{name} mean", reads=src_name)
        a(Opcode.VSUB, dst=abuf(dst), src1=abuf(src, src_reg), src2=mean, rows=rows, n=d, dst_stride=r,
          src1_stride=r, src2_stride=sw, flags=row_scalar, writes=centred, reads=(src_name, f"{name} mean"))
        a(Opcode.VMUL, dst=abuf(scratch), src1=abuf(dst), src2=imm(1.0 / d), rows=rows, n=d, dst_stride=r,
          src1_stride=r, writes=f"{name} centred/D", reads=centred)
        a(Opcode.VDOT, dst=var, src1=abuf(scratch), src2=abuf(dst), rows=rows, n=d, dst_stride=sw, src1_stride=r,
          src2_stride=r, writes=var_name, reads=(f"{name} centred/D", centred))
        a(Opcode.VADD, dst=var, src1=var, src2=imm(eps), rows=rows, n=1, dst_stride=sw, src1_stride=sw,
          writes=var_name, reads=var_name)
        a(Opcode.VRSQRT, dst=rstd, src1=var, rows=rows, n=1, dst_stride=sw, src1_stride=sw, writes=rstd_name,
          reads=var_name)
        a(Opcode.VMUL, dst=abuf(dst), src1=abuf(dst), src2=rstd, rows=rows, n=d, dst_stride=r, src1_stride=r,
          src2_stride=sw, flags=row_scalar, writes=f"{name} normalised", reads=(centred, rstd_name))
        a(Opcode.VSCALE_SHIFT, dst=abuf(dst), src1=abuf(dst), src2=abuf(params), aux=abuf(params + r), rows=rows,
          n=d, dst_stride=r, src1_stride=r, writes=name, reads=(f"{name} normalised", params_name, params_name))
        self._probe(name, dst, d, rows="run" if src_reg == 0 else "last", stride=r)

    def _next_piece_of(self, origin: tuple) -> bool:
        return self.stream.used < len(self.pieces) and self.pieces[self.stream.used].origin[:2] == origin

    def _matmul(self, src: int, src_name: str, src_stride: int, dst: int, dst_stride: int, name: str, rows,
                gelu: bool) -> None:
        """dst (value `name`) = src @ the next weight piece (+ bias, GELU)."""
        piece, address = self.stream.take()
        aux = {"aux": wbuf(address + piece.cols * piece.stride)} if piece.aux_words else {}
        if piece.int8:
            aux["aux_stride"] = piece.cols      # the scales' row after the biases'
        self.asm(Opcode.MATMUL, dst=abuf(dst), src1=abuf(src), src2=wbuf(address), **aux, rows=rows, n=piece.cols,
                 k=piece.k, dst_stride=dst_stride, src1_stride=src_stride, src2_stride=piece.stride,
                 flags={"gelu": int(gelu), "int8": int(piece.int8)}, writes=name,
                 reads=(src_name, piece.name) + ((piece.name,) if piece.aux_words else ()))
        self.stream.fill()

    def _linear(self, origin: tuple, src: int, src_name: str, src_stride: int, dst: int, name: str,
                dst_stride: int, rows=reg(ROWS), gelu: bool = False) -> None:
        """dst[:, local columns] (value `name`) = src @ W[:, columns] (+ bias, GELU) for the weight slice
        `origin` (layer, slice index), one MATMUL per piece (none when the card has no columns of it)."""
        while self._next_piece_of(origin):
            column = self.pieces[self.stream.used].origin[2]
            self._matmul(src, src_name, src_stride, dst + column, dst_stride, name, rows, gelu)

    def _gathered_linear(self, origin: tuple, src: int, src_name: str, src_stride: int, dst: int, name: str,
                         width: int, start: int, staging: int, gelu: bool = False) -> None:
        """dst (value `name`, rows x width) = src @ W + b (GELU) for the weight slice `origin`, each card computing
        its columns from `start` on, all-gathered piece by piece on several cards: every weight piece's ALLGATHER
        follows its MATMUL, so the ring moves one piece's columns while the matrix unit computes the next and only
        the last piece's exchange waits on the matrix unit. The first piece is written in place; the later ones
        to blocks of their own in `staging` (dense rows, one after another), since the scoreboard takes an
        ALLGATHER's destination to span every column between its lowest and highest slice, the card's own later
        columns included. Every card cuts the slice into as many pieces (Context.gathered_pieces), so that the
        cards' all-gathers meet; a card without a piece contributes nothing to that one."""
        if self.ctx.config.cards == 1:
            self._linear(origin, src, src_name, src_stride, dst + start, name, width, gelu=gelu)
            return
        first = 0
        for chunk in range(len(self.ctx.gathered_pieces[origin[1]][self.card])):
            block, stride, n, column, value = dst + start, width, 0, 0, name
            if self._next_piece_of(origin):
                piece = self.pieces[self.stream.used]
                n, column = piece.cols, piece.origin[2]
                if chunk:
                    block, stride, value = staging + (column - first) * self.plan.max_rows, n, f"{name} own"
                else:
                    first = n
                self._matmul(src, src_name, src_stride, block, stride, value, reg(ROWS), gelu)
            self.asm(Opcode.ALLGATHER, dst=abuf(dst), src1=abuf(block), rows=reg(ROWS), n=n, k=start + column,
                     dst_stride=width, src1_stride=stride, writes=name, reads=value)

    def _allgather(self, base: int, name: str, stride: int, start: int, stop: int) -> None:
        """Every card's columns [start, stop) of value `name` (rows x stride at base), gathered on all cards."""
        if self.ctx.config.cards > 1:
            self.asm(Opcode.ALLGATHER, dst=abuf(base), src1=abuf(base + start), rows=reg(ROWS), n=stop - start,
                     k=start, dst_stride=stride, src1_stride=stride, writes=name, reads=name)

    def _kv_names(self, layer: int, group: int) -> tuple[str, str]:
        return f"L{layer}.K g{group}", f"L{layer}.Vt g{group}"

    def _attention_inputs(self, layer: int, group: int) -> int:
        """Emits the LOADs of a head group's earlier keys and values (rows 0 .. pos - 1 of the layer's KV cache)
        into its KV area in the weight buffer (V transposed); returns the area's address."""
        plan, hd, kv = self.plan, self.ctx.dims.head_dim, self.kv_area
        start, stop = self.groups[group]
        gw, key_row = (stop - start) * hd, kv.key_row(stop - start)
        area = plan.kv_start + (self.area_counter % plan.kv_areas) * kv.words
        self.area_counter += 1
        cache, (keys, values) = self.kv[layer], self._kv_names(layer, group)
        for h0, h1, offset in self._key_slots(start, stop):
            self.asm(Opcode.LOAD, dst=wbuf(area + offset), src1=hbm(cache + h0 * kv.key_words), rows=reg(POS),
                     n=(h1 - h0) * hd, dst_stride=key_row, src1_stride=self.key_width, writes=keys,
                     reads=f"KV cache L{layer}")
        self.asm(Opcode.LOAD, dst=wbuf(area + kv.values), src1=hbm(self._values_at(layer, start)), rows=gw,
                 n=reg(POS), dst_stride=kv.value_row, src1_stride=kv.value_row, writes=values,
                 reads=f"KV cache L{layer}")
        return area

    def _values_at(self, layer: int, head: int) -> int:
        """HBM word of local head `head`'s V^T rows in the layer's V cache (after max_context K-cache rows; one row
        of value_row words per dimension, as in the KV areas)."""
        kv = self.kv_area
        return self.kv[layer] + self.ctx.max_context * self.key_width + head * kv.head_dim * kv.value_row

    def _key_slots(self, start: int, stop: int) -> list:
        """The copies that put heads start .. stop - 1's keys into their slots of a key row (of a KV area or the K
        cache): (first head, end head, offset in the row); one copy of all when a key fills its slot
        (key_words = head_dim), else one a head."""
        kv = self.kv_area
        if kv.key_words == kv.head_dim:
            return [(start, stop, 0)]
        return [(h, h + 1, (h - start) * kv.key_words) for h in range(start, stop)]

    def _append_kv(self, layer: int) -> None:
        """Appends the run's new K rows of every local head to the layer's K cache in HBM (position-major, each
        head's key in its slot, as attention loads them): one STORE, or one a head where a key is shorter than
        its slot. The V cache is transposed (one row of value_row words per dimension, so that attention loads
        V^T as a plain 2-D block); its new columns are stored per head group by _attention, by a transposed STORE
        from the QKV block."""
        width, hd = self.kv_width, self.ctx.dims.head_dim
        for h0, h1, offset in self._key_slots(0, self.local_heads):
            self.asm(Opcode.STORE, dst=hbm(self.kv[layer] + offset, POS_KV), src1=abuf(self.plan["QKV"] + h0 * hd),
                     rows=reg(ROWS), n=(h1 - h0) * hd, dst_stride=self.key_width, src1_stride=3 * width,
                     writes=f"KV cache L{layer}", reads=f"L{layer}.qkv")

    def _attention(self, layer: int, first_area: int | None) -> None:
        """Causal attention of the local heads over the keys 0 .. pos + rows - 1, each head's output into its
        columns of the gathered attention block. Per head group, the run's new keys and values are copied from
        the QKV block into the KV area (in WBUF) behind the earlier ones, and the new values are stored to the V
        cache, transposed, from the QKV block (a STORE reads ABUF only). The heads are software-pipelined: head h+1's
        scores are issued before head h's weighted sum, so the matrix unit works while the vector unit does
        head h's softmax; with one KV area (or one score area) the pending weighted sum is issued before the
        area is overwritten."""
        plan, a, kv = self.plan, self.asm, self.kv_area
        hd, width = self.ctx.dims.head_dim, self.kv_width
        qkv, pending, L = plan["QKV"], None, f"L{layer}."
        for group, (start, stop) in enumerate(self.groups):
            if group and pending and self.one_kv_area:
                # One KV area: the next group's keys and values overwrite the pending head's V^T.
                self._weighted_values(*pending)
                pending = None
            area = first_area if group == 0 else self._attention_inputs(layer, group)
            gw, key_row = (stop - start) * hd, kv.key_row(stop - start)
            keys, values_t = area, area + kv.values
            key_name, value_name = self._kv_names(layer, group)
            for h0, h1, offset in self._key_slots(start, stop):
                a(Opcode.LOAD, dst=wbuf(keys + offset, self.width_reg[key_row]), src1=abuf(qkv + h0 * hd),
                  rows=reg(ROWS), n=(h1 - h0) * hd, dst_stride=key_row, src1_stride=3 * width, writes=key_name,
                  reads=L + "qkv")
            a(Opcode.LOAD, dst=wbuf(values_t, POS), src1=abuf(qkv + width + start * hd), rows=reg(ROWS), n=gw,
              dst_stride=kv.value_row, src1_stride=3 * width, flags={"transpose": 1}, writes=value_name,
              reads=L + "qkv")
            # the group's new values into the V cache, transposed (a word a job: rows x gw jobs). Here, ahead of the
            # last weight loads, decode is fastest (later, the MLP's first MATMUL, which overwrites QKV, waits for
            # it: +9 % on 1.5B's decode on 4 cards); a prompt would rather have it behind them (-3 %)
            a(Opcode.STORE, dst=hbm(self._values_at(layer, start), POS), src1=abuf(qkv + width + start * hd),
              rows=reg(ROWS), n=gw, dst_stride=kv.value_row, src1_stride=3 * width, flags={"transpose": 1},
              writes=f"KV cache L{layer}", reads=L + "qkv")
            if group == len(self.groups) - 1:
                self.stream.hold = len(self.pieces)
                self.stream.fill()
            for h in range(start, stop):
                if pending and self.one_score_area:
                    # One score area: head h's scores overwrite the pending head's.
                    self._weighted_values(*pending)
                    pending = None
                scores = self._scores(layer, h, keys + (h - start) * kv.key_words, key_row, key_name)
                if pending:
                    self._weighted_values(*pending)
                self._softmax(layer, h, scores)
                pending = (layer, h, scores, values_t + (h - start) * hd * kv.value_row, value_name)
        if pending:
            self._weighted_values(*pending)

    @property
    def one_kv_area(self) -> bool:
        """Head groups share one KV area: a pending weighted sum must be issued before the next group's load."""
        return self.plan.kv_areas == 1

    @property
    def one_score_area(self) -> bool:
        """Heads share one score area: a pending weighted sum must be issued before the next head's scores."""
        return self.plan.score_areas == 1

    def _head_names(self, layer: int, h: int) -> tuple[str, str, str]:
        """The names of local head h's scores (then probabilities), row maximum and row sum."""
        head = f"L{layer}.head {self.h0 + h}"
        return f"{head} scores", f"{head} max", f"{head} sum"

    def _scores(self, layer: int, h: int, keys: int, key_stride: int, key_name: str) -> int:
        """MASKED_QK of local head h (keys: column j at keys + j * key_stride); returns the score area."""
        plan, hd, tmax = self.plan, self.ctx.dims.head_dim, self.score_row
        which = h % plan.score_areas
        scores = plan["SCORES"] + which * tmax * plan.max_rows
        score_name, max_name, _ = self._head_names(layer, h)
        self.asm(Opcode.MASKED_QK, dst=abuf(scores), src1=abuf(plan["QKV"] + 2 * self.kv_width + h * hd),
                 src2=wbuf(keys), aux=abuf(plan["S"] + Stat.ROWMAX[which]), rows=reg(ROWS), n=reg(TOKENS), k=hd,
                 pos=reg(POS), dst_stride=tmax, src1_stride=3 * self.kv_width, src2_stride=key_stride,
                 aux_stride=STAT_WORDS, writes=(score_name, max_name), reads=(f"L{layer}.qkv", key_name))
        return scores

    def _softmax(self, layer: int, h: int, scores: int) -> None:
        a, plan, tmax, sw = self.asm, self.plan, self.score_row, STAT_WORDS
        which = h % plan.score_areas
        rowmax, rowsum = abuf(plan["S"] + Stat.ROWMAX[which]), abuf(plan["S"] + Stat.ROWSUM[which])
        rows, tokens, row_scalar = reg(ROWS), reg(TOKENS), {"src2_row_scalar": 1}
        p, m, total = self._head_names(layer, h)
        a(Opcode.VSUB, dst=abuf(scores), src1=abuf(scores), src2=rowmax, rows=rows, n=tokens, dst_stride=tmax,
          src1_stride=tmax, src2_stride=sw, flags=row_scalar, writes=p, reads=(p, m))
        a(Opcode.VEXP, dst=abuf(scores), src1=abuf(scores), rows=rows, n=tokens, dst_stride=tmax, src1_stride=tmax,
          writes=p, reads=p)
        a(Opcode.VSUM, dst=rowsum, src1=abuf(scores), rows=rows, n=tokens, dst_stride=sw, src1_stride=tmax,
          writes=total, reads=p)
        a(Opcode.VRECIP, dst=rowsum, src1=rowsum, rows=rows, n=1, dst_stride=sw, src1_stride=sw, writes=total,
          reads=total)
        a(Opcode.VMUL, dst=abuf(scores), src1=abuf(scores), src2=rowsum, rows=rows, n=tokens, dst_stride=tmax,
          src1_stride=tmax, src2_stride=sw, flags=row_scalar, writes=p, reads=(p, total))

    def _weighted_values(self, layer: int, h: int, scores: int, values_t: int, value_name: str) -> None:
        plan, hd, tmax = self.plan, self.ctx.dims.head_dim, self.score_row
        self.asm(Opcode.MATMUL, dst=abuf(plan["BIG"] + (self.h0 + h) * hd), src1=abuf(scores), src2=wbuf(values_t),
                 rows=reg(ROWS), n=hd, k=reg(TOKENS), dst_stride=self.row, src1_stride=tmax,
                 src2_stride=self.kv_area.value_row, writes=f"L{layer}.attn",
                 reads=(self._head_names(layer, h)[0], value_name))


@dataclass
class Context:
    """What every card's builder shares."""
    model: object
    config: ArchConfig
    dims: ModelDims
    partition: Partition
    max_context: int
    plans: list
    slots: int
    slot_words: int
    tied: bool
    """The LM head is read from wte (GPT-2's tied weights, FP16 weights)."""
    ids_offset: int
    logits_offset: int
    int8: bool = False
    """The matrix weights are INT8 (W8A16), the LM head's included."""

    @functools.cached_property
    def gathered_pieces(self) -> dict:
        """layout.gathered_pieces of this model and config."""
        return gathered_pieces(self.config, self.dims, self.partition, self.slot_words, self.int8)


def compile_model(model, config: ArchConfig, max_context: int = 1024, *, wbuf_slots: int = DEFAULT_WBUF_SLOTS,
                  kv_group: int | None = None, max_rows: int | None = None, weights: str = "fp16") -> ApplianceImage:
    """The appliance image of a GPT-2 model (transformers GPT2LMHeadModel; its weights taken as FP16) on
    config.cards cards of `config`, for contexts of up to max_context tokens. A model on the meta device gives
    an image with programs and layout but no HBM contents (for timing-only runs). `wbuf_slots` and
    `kv_group` (heads per KV transfer; default: chosen by the activation-buffer planner) tune the schedule;
    `max_rows` caps the tokens per run (default: as many as the activation buffer holds). `weights`: the matrix
    weights' format, one of WEIGHT_FORMATS ("int8": numerics.quantize_int8 of the FP32 weights, the LM head
    an INT8 copy beside wte's FP16 rows, which the embedding reads)."""
    if weights not in WEIGHT_FORMATS:
        raise CompileError(f"weights={weights!r}: choose one of {', '.join(WEIGHT_FORMATS)}")
    int8 = weights == "int8"
    dims = ModelDims.of(model)
    if not 1 <= max_context <= dims.n_positions:
        raise CompileError(f"max_context={max_context} must be in 1..{dims.n_positions} (the model's positions)")
    if not 2 <= wbuf_slots <= config.wbuf_words // config.mac_width:
        raise CompileError(f"wbuf_slots={wbuf_slots} must be in 2..{config.wbuf_words // config.mac_width}")
    for name, value in (("kv_group", kv_group), ("max_rows", max_rows)):
        if value is not None and value < 1:
            raise CompileError(f"{name}={value} must be at least 1")
    problem = token_id_problem("eos_token_id", model.config.eos_token_id, dims.vocab_size)
    if problem:
        raise CompileError(f"the model's {problem}: the image's runtime stops generating at it")
    filled = has_weights(model)
    if filled:
        check_weights(model.named_parameters(), f"model {getattr(model.config, 'name_or_path', '')!r}", CompileError,
                      fp16=True)
    part = model_partition(dims, config)
    kv, plans = plan_buffers(config, dims, part, max_context, wbuf_slots, kv_group, max_rows, int8)
    max_rows = plans[0].max_rows
    logits_offset = align_up(max_rows, config.beat_words)
    ctx = Context(model, config, dims, part, max_context, plans, wbuf_slots, kv.slot_words,
                  lm_head_tied(model) and not int8, 0, logits_offset, int8)
    builders = [CardBuilder(ctx, card) for card in range(config.cards)]
    if filled:
        for builder in builders:
            builder.new_segments()
        for layer in range(dims.n_layer):
            layer_weights = LayerWeights(model, layer, dims, int8)
            for builder in builders:
                builder.fill_layer(layer, layer_weights)
        t = model.transformer
        head = None if ctx.tied else lm_head_int8(model) if int8 else fp16(model.lm_head.weight)
        shared = (fp16(t.wte.weight), fp16(t.wpe.weight), np.concatenate([fp16(t.ln_f.weight), fp16(t.ln_f.bias)]),
                  head)
    codes = [builder.program() for builder in builders]
    host_words = [builder.chunk_max_offset + chunk_count(builder.v1 - builder.v0) for builder in builders]
    verify_programs([CardPlan(code, builder.asm.flow, {r.name: (r.start, r.stop) for r in builder.hbm.regions},
                              {"ids": (ctx.ids_offset, ctx.ids_offset + max_rows),
                               "logits": (logits_offset, logits_offset + builder.v1 - builder.v0),
                               "chunk maxima": (builder.chunk_max_offset, words)},
                              builder.hbm.top, words)
                     for builder, code, words in zip(builders, codes, host_words)],
                    config, verification_cases(max_context, max_rows))
    cards = []
    for builder, code, words in zip(builders, codes, host_words):
        program = Program(code, config.name, config.hash, builder.card, config.cards,
                          {"model": dims.to_dict(), "max_rows": max_rows, "max_context": max_context})
        cards.append(CardImage(program, builder.segments(*shared) if filled else [], builder.hbm.top, words))
    meta = {
        "compiler_version": COMPILER_VERSION,
        "model": dims.to_dict(),
        "source": getattr(model.config, "name_or_path", ""),
        "eos_token_id": model.config.eos_token_id,
        "weights_hash": weights_hash(model) if filled else None,
        "weights": weights,
        "max_context": max_context,
        "max_rows": max_rows,
        "wbuf_slots": wbuf_slots,
        "partition": part.to_dict(),
        "host": {"ids_offset": ctx.ids_offset,
                 "logits": [{"card": b.card, "offset": logits_offset, "vocab": [b.v0, b.v1],
                             "chunk_max_offset": b.chunk_max_offset, "chunk": LOGIT_CHUNK} for b in builders]},
        "hbm_map": [b.hbm.to_list() for b in builders],
        "abuf": [p.to_dict() for p in plans],
        "probes": [b.probes for b in builders],
    }
    return ApplianceImage(config, cards, meta)
