"""Simulation-speed benchmark: a synthetic GPT-2-shaped decode program (the work of one token,
split over the cards as the appliance splits it: heads, MLP and projection columns, LM-head
vocabulary) run on SimulatorDevice, one run per token.

    python -m ringgpt.sim.functional.bench --config u280 --cards 4 --tokens 8

The weights are random; the point is the amount and shape of the work (124M MACs per token for
GPT-2 small), not the text. Prints simulated tokens per second and the cycle model's summary."""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import numpy as np

from ringgpt.host.image import ApplianceImage, CardImage
from ringgpt.hw.config import ArchConfig, get_config
from ringgpt.hw.isa import Program, assemble
from ringgpt.sim.functional.device import SimulatorDevice


@dataclass(frozen=True)
class Shape:
    layers: int = 12
    d_model: int = 768
    heads: int = 12
    d_ff: int = 3072
    vocab: int = 50257
    context: int = 1024

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


def _split(total: int, cards: int, card: int) -> tuple[int, int]:
    """(count, offset) of card's share of `total` items, the first cards taking one more."""
    base, extra = divmod(total, cards)
    return base + (card < extra), card * base + min(card, extra)


class _Layout:
    """Bump allocator of word addresses."""

    def __init__(self):
        self.top = 0

    def take(self, words: int) -> int:
        address, self.top = self.top, self.top + words
        return address


def _card_program(s: Shape, cards: int, card: int, cfg: ArchConfig, rng) -> tuple[str, list, int, int]:
    """Assembly, HBM segments, HBM words and host words of one card's decode program."""
    hbm, abuf, segments, lines = _Layout(), _Layout(), [], []
    d, hd = s.d_model, s.head_dim
    heads, _ = _split(s.heads, cards, card)
    ff, _ = _split(s.d_ff, cards, card)
    cols, _ = _split(d, cards, card)
    vocab, _ = _split(s.vocab, cards, card)
    bank = [0, cfg.wbuf_bank_words]
    use = [0]

    def weights(rows: int, words_per_row: int) -> int:
        address = hbm.take(rows * words_per_row)
        segments.append((address, (rng.standard_normal(rows * words_per_row) * 0.02).astype(np.float16)))
        return address

    def next_bank() -> int:
        use[0] ^= 1
        return bank[use[0]]

    def emit(text: str):
        lines.append(text)

    x, ln, qkv, sc, mx, sm = (abuf.take(n) for n in (d, d, 3 * heads * hd, s.context, 8, 8))
    att, att_all, proj, hid, hid_all = (abuf.take(n) for n in (heads * hd, d, cols, ff, s.d_ff))
    gamma = abuf.take(d)
    ones = hbm.take(d)
    segments.append((ones, np.ones(d, np.float16)))
    emit(f"LOAD dst=ABUF[{gamma}] src1=HBM[{ones}] rows=1 n={d}")
    emit(f"MULI rd=r3 rs=r1 imm={hd}")
    table = weights(s.vocab if card == 0 else 1, d)
    emit(f"GATHER dst=ABUF[{x}] src1=HBM[{table}] src2=HOST[0] rows=1 n={d} src1_stride={d}")

    def layernorm():
        emit(f"VSUM dst=ABUF[{mx}] src1=ABUF[{x}] rows=1 n={d}")
        emit(f"VSUB dst=ABUF[{ln}] src1=ABUF[{x}] src2=ABUF[{mx}] rows=1 n={d} +src2_row_scalar")
        emit(f"VDOT dst=ABUF[{mx + 1}] src1=ABUF[{ln}] src2=ABUF[{ln}] rows=1 n={d}")
        emit(f"VRSQRT dst=ABUF[{mx + 2}] src1=ABUF[{mx + 1}] rows=1 n=1")
        emit(f"VSCALE_SHIFT dst=ABUF[{ln}] src1=ABUF[{ln}] src2=ABUF[{mx + 2}] aux=IMM[0x0000] rows=1 n={d} "
             "+src2_row_scalar")
        emit(f"VMUL dst=ABUF[{ln}] src1=ABUF[{ln}] src2=ABUF[{gamma}] rows=1 n={d}")

    def dense(dst: int, src: int, k: int, n: int, gelu: bool = False):
        w, b = weights(n, k), next_bank()
        emit(f"LOAD dst=WBUF[{b}] src1=HBM[{w}] rows=1 n={n * k}")
        emit(f"MATMUL dst=ABUF[{dst}] src1=ABUF[{src}] src2=WBUF[{b}] rows=1 n={n} k={k} src2_stride={k}"
             + (" +gelu" if gelu else ""))

    for _ in range(s.layers):
        layernorm()
        dense(qkv, ln, d, 3 * heads * hd)
        kcache = hbm.take(heads * s.context * hd)
        vcache = hbm.take(heads * hd * s.context)
        for h in range(heads):
            kq, kk, kv = qkv + h * hd, qkv + (heads + h) * hd, qkv + (2 * heads + h) * hd
            k_at, v_at = kcache + h * s.context * hd, vcache + h * hd * s.context
            emit(f"STORE dst=HBM[{k_at}+r3] src1=ABUF[{kk}] rows=1 n={hd}")
            emit(f"STORE dst=HBM[{v_at}+r1] src1=ABUF[{kv}] rows=1 n={hd} dst_stride={s.context} +transpose")
            b = next_bank()
            emit(f"LOAD dst=WBUF[{b}] src1=HBM[{k_at}] rows=r1+1 n={hd} dst_stride={hd} src1_stride={hd}")
            emit(f"MASKED_QK dst=ABUF[{sc}] src1=ABUF[{kq}] src2=WBUF[{b}] aux=ABUF[{sm}] rows=1 n=r1+1 k={hd} "
                 f"pos=r1 src2_stride={hd}")
            emit(f"VSUB dst=ABUF[{sc}] src1=ABUF[{sc}] src2=ABUF[{sm}] rows=1 n=r1+1 +src2_row_scalar")
            emit(f"VEXP dst=ABUF[{sc}] src1=ABUF[{sc}] rows=1 n=r1+1")
            emit(f"VSUM dst=ABUF[{sm + 1}] src1=ABUF[{sc}] rows=1 n=r1+1")
            emit(f"VRECIP dst=ABUF[{sm + 2}] src1=ABUF[{sm + 1}] rows=1 n=1")
            emit(f"VMUL dst=ABUF[{sc}] src1=ABUF[{sc}] src2=ABUF[{sm + 2}] rows=1 n=r1+1 +src2_row_scalar")
            b = next_bank()
            emit(f"LOAD dst=WBUF[{b}] src1=HBM[{v_at}] rows={hd} n=r1+1 dst_stride={s.context} "
                 f"src1_stride={s.context}")
            emit(f"MATMUL dst=ABUF[{att + h * hd}] src1=ABUF[{sc}] src2=WBUF[{b}] rows=1 n={hd} k=r1+1 "
                 f"src2_stride={s.context}")
        first_head = _split(s.heads, cards, card)[1]
        emit(f"ALLGATHER dst=ABUF[{att_all}] src1=ABUF[{att}] rows=1 n={heads * hd} k={first_head * hd}")
        dense(proj, att_all, d, cols)
        emit(f"ALLGATHER dst=ABUF[{ln}] src1=ABUF[{proj}] rows=1 n={cols} k={_split(d, cards, card)[1]}")
        emit(f"VADD dst=ABUF[{x}] src1=ABUF[{x}] src2=ABUF[{ln}] rows=1 n={d}")
        layernorm()
        dense(hid, ln, d, ff, gelu=True)
        emit(f"ALLGATHER dst=ABUF[{hid_all}] src1=ABUF[{hid}] rows=1 n={ff} k={_split(s.d_ff, cards, card)[1]}")
        dense(proj, hid_all, s.d_ff, cols)
        emit(f"ALLGATHER dst=ABUF[{ln}] src1=ABUF[{proj}] rows=1 n={cols} k={_split(d, cards, card)[1]}")
        emit(f"VADD dst=ABUF[{x}] src1=ABUF[{x}] src2=ABUF[{ln}] rows=1 n={d}")
    layernorm()
    chunk = cfg.wbuf_bank_words // d
    for start in range(0, vocab, chunk):
        n = min(chunk, vocab - start)
        dense(sc, ln, d, n)
        emit(f"STORE dst=HOST[{8 + start}] src1=ABUF[{sc}] rows=1 n={n}")
    emit("HALT")
    return "\n".join(lines), segments, hbm.top, 8 + vocab


def build_image(cfg: ArchConfig, shape: Shape = Shape(), seed: int = 0) -> ApplianceImage:
    """The synthetic decode image for every card of `cfg`."""
    rng = np.random.default_rng(seed)
    cards = []
    for card in range(cfg.cards):
        text, segments, hbm_words, host_words = _card_program(shape, cfg.cards, card, cfg, rng)
        program = Program(assemble(text), cfg.name, cfg.hash, card, cfg.cards)
        cards.append(CardImage(program, segments, hbm_words, host_words))
    return ApplianceImage(cfg, cards, {"synthetic": "gpt2-decode-bench"})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="u280")
    parser.add_argument("--cards", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--pos", type=int, default=64, help="position of the first decoded token")
    args = parser.parse_args(argv)
    cfg = get_config(args.config, args.cards)
    image = build_image(cfg)
    device = SimulatorDevice(cfg)
    device.load(image)
    for card in range(cfg.cards):
        device.write_host(card, 0, np.array([464], np.uint16))
    started = time.perf_counter()
    for token in range(args.tokens):
        stats = device.run(args.pos + token, 1)
    wall = time.perf_counter() - started
    print(json.dumps({"config": cfg.name, "tokens": args.tokens, "wall_s": round(wall, 3),
                      "tokens_per_s": round(args.tokens / wall, 2),
                      "last_run_wall_s": round(stats.wall_seconds, 3),
                      "modeled": {k: (round(v, 4) if isinstance(v, float) else v)
                                  for k, v in device.last_report.summary().items()}}, indent=1))


if __name__ == "__main__":
    main()
