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
* `prime`: the buffers' own map (hw/banks.py: bank = c mod 17 at u280, ArchConfig.buffer_banks, the smallest prime above
  mpu_lanes; its stalls are what the cycle model charges).

The vector unit reads its operands (src1, src2, aux) the same way, as the lanes of one TileReadPort on ABUF: it
prints the stalls that adds (cycle_model.vector_stall_cycles, which the cycle model charges).

It prints, per program, the matrix unit's busy cycles (sim/cycle_model.instruction_cost, with the `prime` stalls)
and the stall cycles each banking would add, with the compiler's layouts as they are (weights column-major at
stride k in WBUF slots, keys at their stride, V^T at the maximum context).

Then the DMA engines (hw/core/port_engine.py, PortEngine): the hbm_channels engines share one write port per memory
for their LOAD beats (an engine merges its beats into whole rows and asks only when a row is complete,
`PortEngine._rows`; each memory takes the first engine's row, `DMAUnit._row_writes`), and one ABUF read for their STORE beats (`DMAUnit._store_reads`: one beat per cycle
in all). For every LOAD and STORE between HBM and ABUF/WBUF of the same programs it replays each engine's
beats (the jobs' words through hw/hbm.py's map) with every engine fed one beat per cycle, or at the HBM's
sustained rate (hbm_bytes_per_cycle shared by the ports), granted as the RTL grants them (the engines behind the
leader first), and counts the cycles the grants add over memories that never conflict: `--no-dma` skips this
part (a few minutes).

The counting is sim/bank_conflicts.py; this script compiles the programs and prints its figures.
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
from ringgpt.hw.resolved import resolve_run, with_gather_slices
from ringgpt.sim.bank_conflicts import SCHEMES, dma_figures, program_figures

ROOT = Path(__file__).resolve().parents[1]
CASES = (("gpt2", 1), ("gpt2-355m", 1), ("gpt2-774m", 2), ("gpt2-1.5b", 4))
RUNS = {"decode at 128": (128, 1), "prompt of 128": (0, 128)}
MAX_CONTEXT = 1024


def compiled_run(name: str, cards: int, pos: int, rows: int):
    """(config, card 0's resolved instructions) of the u280 program; the cards' programs have the same shapes."""
    with torch.device("meta"):
        model = GPT2LMHeadModel(synthetic_config(name))
    cfg = get_config("u280", cards)
    image = compile_model(model, cfg, MAX_CONTEXT)
    runs = with_gather_slices([resolve_run(card.program.instructions, c, pos, rows) for c, card in enumerate(image.cards)])
    return cfg, runs[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "bank_conflicts.json")
    parser.add_argument("--no-dma", action="store_true", help="skip the DMA engines' grants")
    args = parser.parse_args(argv)
    report, runs = {}, {}
    print(f"{'program':34}{'matrix cycles':>15}" + "".join(f"{s + ' extra':>16}" for s in SCHEMES))
    for name, cards in CASES:
        for run, (pos, rows) in RUNS.items():
            label = f"{name} x{cards}, {run}"
            runs[label] = compiled_run(name, cards, pos, rows)
            f = report[label] = program_figures(*runs[label])
            print(f"{label:34}{f['matrix_cycles']:>15,}"
                  + "".join(f"{f[s]:>9,} ({100 * f[s] / f['matrix_cycles']:>3.0f}%)" for s in SCHEMES), flush=True)
    print("\nThe units' tiles through one read port per memory (weights, x and bias; vector operands): stalls in "
          "their busy cycles")
    print(f"{'program':34}{'matrix cycles':>15}{'stalls':>18}{'vector cycles':>15}{'stalls':>18}")
    for label, f in report.items():
        print(f"{label:34}" + "".join(f"{f[unit + '_cycles']:>15,}{f[unit + '_stalls']:>10,} "
                                      f"({100 * f[unit + '_stalls'] / max(f[unit + '_cycles'], 1):>4.1f}%)"
                                      for unit in ("matrix", "vector")))
    if not args.no_dma:
        print("\nDMA engines' grants (HBM <-> ABUF/WBUF LOADs and STOREs): extra cycles over conflict-free memories")
        print(f"{'program':34}{'transfers':>10}{'cycles, 1 beat/cycle':>24}{'extra':>14}{'cycles, HBM rate':>20}{'extra':>14}")
        for label, (cfg, run) in runs.items():
            f = report[label]["dma"] = dma_figures(cfg, run)
            print(f"{label:34}{f['transfers']:>10,}" + "".join(
                f"{f[rate + '_cycles']:>{w},}{f[rate + '_extra']:>7,} ({100 * f[rate + '_extra'] / max(f[rate + '_cycles'], 1):>4.1f}%)"
                for rate, w in (("port", 24), ("hbm", 20))), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
