#!/usr/bin/env python3
"""Bank conflicts of the matrix unit's weight reads under candidate buffer bankings, over compiled GPT-2 programs.

    python scripts/bank_conflicts.py [--json out/bank_conflicts.json]

The matrix unit reads its mpu_lanes weight tiles through one read port per buffer memory (hw/core/buffers.py,
TileReadPort): lane l of beat (row, column group g, tile t) reads mac_width words from
src2 + (g * lanes + l) * src2_stride + t * mac_width, one or two 64-word chunks; a memory delivers one chunk per
cycle, so the beat takes as many cycles as the busiest memory holds distinct chunks (cycle_model.weight_beat_cycles), and the
unit stalls for the rest. This script counts the stalls of every MATMUL and MASKED_QK of the u280 programs the
benchmark times (decode at position 128, and a 128-token prompt) under three bankings:

* `pow2`:  bank = c mod 16;
* `skew`:  bank = (c + c div 16) mod 16 (skewed storage);
* `prime`: bank = c mod 17 (what hw/core/buffers.py builds: ArchConfig.buffer_banks, the smallest prime above
  mpu_lanes; its stalls are what the cycle model charges).

It prints, per program, the matrix unit's busy cycles (sim/cycle_model.instruction_cost, with the `prime` stalls)
and the stall cycles each banking would add, with the compiler's layouts as they are (weights column-major at
stride k in WBUF slots, keys at their stride, V^T at the maximum context).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import GPT2LMHeadModel

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.models import synthetic_config
from ringgpt.hw.config import get_config
from ringgpt.hw.isa import OPCODES, Unit
from ringgpt.hw.resolved import resolve_run, with_gather_slices
from ringgpt.sim.cycle_model import instruction_cost, weight_beat_cycles

ROOT = Path(__file__).resolve().parents[1]
CASES = (("gpt2", 1), ("gpt2-355m", 1), ("gpt2-774m", 2), ("gpt2-1.5b", 4))
RUNS = {"decode at 128": (128, 1), "prompt of 128": (0, 128)}
SCHEMES = {"pow2": (16, lambda c: c % 16), "skew": (16, lambda c: (c + c // 16) % 16), "prime": (17, lambda c: c % 17)}
MAX_CONTEXT = 1024


def program_figures(name: str, cards: int, pos: int, rows: int) -> dict:
    with torch.device("meta"):
        model = GPT2LMHeadModel(synthetic_config(name))
    cfg = get_config("u280", cards)
    image = compile_model(model, cfg, MAX_CONTEXT)
    runs = with_gather_slices([resolve_run(card.program.instructions, c, pos, rows) for c, card in enumerate(image.cards)])
    out = {"matrix_cycles": 0, **{scheme: 0 for scheme in SCHEMES}}
    cache: dict = {}
    for r in runs[0]:                                   # card 0; the cards' programs have the same shapes
        if r is None or OPCODES[r.op].unit is not Unit.MATRIX or not (r.rows and r.n and r.k):
            continue
        out["matrix_cycles"] += instruction_cost(r, cfg).cycles
        key = (r.src2[1] % (17 * 16 * cfg.buffer_chunk_words), r.src2_stride, r.n, r.k)
        if key not in cache:
            cache[key] = {scheme: int((weight_beat_cycles(r.src2[1], r.src2_stride, r.n, r.k, cfg, banks, bank_of)
                                       - 1).sum())
                          for scheme, (banks, bank_of) in SCHEMES.items()}
        for scheme, extra in cache[key].items():
            out[scheme] += r.rows * extra
    out["clock_mhz"] = cfg.clock_mhz
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "bank_conflicts.json")
    args = parser.parse_args(argv)
    report = {}
    print(f"{'program':34}{'matrix cycles':>15}" + "".join(f"{s + ' extra':>16}" for s in SCHEMES))
    for name, cards in CASES:
        for run, (pos, rows) in RUNS.items():
            label = f"{name} x{cards}, {run}"
            f = report[label] = program_figures(name, cards, pos, rows)
            print(f"{label:34}{f['matrix_cycles']:>15,}"
                  + "".join(f"{f[s]:>9,} ({100 * f[s] / f['matrix_cycles']:>3.0f}%)" for s in SCHEMES), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
