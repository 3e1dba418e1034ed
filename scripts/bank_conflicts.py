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

Then the DMA engines (hw/core/dma.py, PortEngine): the hbm_channels engines share one write port per memory
for their LOAD beats (an engine merges its beats into whole rows and asks only when a row is complete,
`PortEngine._rows`; each memory takes the first engine's row, `DMAUnit._row_writes`), and one ABUF read for their STORE beats (`DMAUnit._store_reads`: one beat per cycle
in all). For every LOAD and STORE between HBM and ABUF/WBUF of the same programs it replays each engine's
beats (the jobs' words through hw/hbm.py's map) with every engine fed one beat per cycle, or at the HBM's
sustained rate (hbm_bytes_per_cycle shared by the ports), granted as the RTL grants them (the engines behind the
leader first), and counts the cycles the grants add over memories that never conflict: `--no-dma` skips this
part (a few minutes).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2LMHeadModel

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.models import synthetic_config
from ringgpt.hw import hbm
from ringgpt.hw.banks import memory_of, period
from ringgpt.hw.config import get_config
from ringgpt.hw.isa import OPCODES, Opcode, Space, Unit
from ringgpt.hw.resolved import resolve_run, with_gather_slices
from ringgpt.sim.cycle_model import (instruction_cost, matrix_stall_cycles, vector_operands, vector_stall_cycles,
                                     weight_beat_cycles)

ROOT = Path(__file__).resolve().parents[1]
CASES = (("gpt2", 1), ("gpt2-355m", 1), ("gpt2-774m", 2), ("gpt2-1.5b", 4))
RUNS = {"decode at 128": (128, 1), "prompt of 128": (0, 128)}
SCHEMES = {"pow2": (16, lambda c: c % 16), "skew": (16, lambda c: (c + c // 16) % 16), "prime": (None, None)}
MAX_CONTEXT = 1024


def compiled_run(name: str, cards: int, pos: int, rows: int):
    """(config, card 0's resolved instructions) of the u280 program; the cards' programs have the same shapes."""
    with torch.device("meta"):
        model = GPT2LMHeadModel(synthetic_config(name))
    cfg = get_config("u280", cards)
    image = compile_model(model, cfg, MAX_CONTEXT)
    runs = with_gather_slices([resolve_run(card.program.instructions, c, pos, rows) for c, card in enumerate(image.cards)])
    return cfg, runs[0]


def program_figures(cfg, run) -> dict:
    """The matrix unit's busy cycles, the stalls of its tiles' shared read ports (cycle_model.matrix_stall_cycles:
    weights, x and bias, in its busy cycles) and the weight stalls of each banking; the vector unit's busy cycles
    and the stalls of its operands' shared read port (cycle_model.vector_stall_cycles, in its busy cycles)."""
    out = {"matrix_cycles": 0, "matrix_stalls": 0, **{scheme: 0 for scheme in SCHEMES}, "vector_cycles": 0,
           "vector_stalls": 0}
    cache: dict = {}
    for r in run:
        if r is not None and OPCODES[r.op].unit is Unit.VECTOR and r.rows and r.n:
            out["vector_cycles"] += instruction_cost(r, cfg).cycles
            out["vector_stalls"] += vector_stall_cycles(r.rows, r.n, vector_operands(r, cfg), cfg)
        if r is None or OPCODES[r.op].unit is not Unit.MATRIX or not (r.rows and r.n and r.k):
            continue
        out["matrix_cycles"] += instruction_cost(r, cfg).cycles
        out["matrix_stalls"] += matrix_stall_cycles(r, cfg)
        key = (r.src2[1] % (17 * 16 * cfg.buffer_chunk_words), r.src2_stride, r.n, r.k)
        if key not in cache:
            cache[key] = {scheme: int((weight_beat_cycles(r.src2[1], r.src2_stride, r.n, r.k, cfg, banks, bank_of)
                                       - 1).sum())
                          for scheme, (banks, bank_of) in SCHEMES.items()}
        for scheme, extra in cache[key].items():
            out[scheme] += r.rows * extra
    out["clock_mhz"] = cfg.clock_mhz
    return out


def engine_requests(cfg, rows: int, n: int, x0: int, x_stride: int, b0: int, b_stride: int, write: bool) -> list:
    """For each HBM engine, the memories (a bit mask) each of its beats asks for, in order, for a transfer of
    `rows` jobs of `n` words, job i at HBM word x0 + i * x_stride and buffer word b0 + i * b_stride. A STORE
    beat asks for the engines' one store read (bit `buffer_banks`: whatever chunks it reads); a LOAD beat (in one
    chunk: the ISA's beat rule, hw/resolved.misaligned_transfer) writes its chunk when it fills it to its last word,
    or where the job's words end in the beat or the beat ends an interleave granule (PortEngine._rows), nothing
    otherwise (its words wait for the next beat)."""
    B, K, banks, G = cfg.beat_words, cfg.buffer_chunk_words, cfg.buffer_banks, cfg.hbm_interleave_words
    lo = x0 + x_stride * np.arange(rows, dtype=np.int64)
    delta = b0 + b_stride * np.arange(rows, dtype=np.int64) - lo
    out = []
    for channel in range(cfg.hbm_channels):
        llo, lhi = hbm.local_range(channel, lo, lo + n, cfg)
        asks = []
        for job in np.flatnonzero(llo < lhi):
            beat = np.arange(llo[job] // B * B, lhi[job], B)
            first, last = np.maximum(beat, llo[job]), np.minimum(beat + B, lhi[job]) - 1
            start = hbm.hbm_word(channel, first, cfg) + delta[job]
            end = start + (last - first)
            if write:
                ends = (lhi[job] - beat <= B) | ((beat + B) % G == 0)
                full = (end % K == K - 1) | ends
                asks.extend(np.where(full, 1 << memory_of(start, K, banks), 0).tolist())
            else:
                asks.extend([1 << banks] * len(beat))
        out.append(asks)
    return out


def grant_cycles(requests: list, rate: float, *, conflicts: bool = True, backlog: float = 4.0) -> int:
    """Cycles until every engine's beats are granted: each cycle an engine gains `rate` beats from its memory (up
    to `backlog` waiting) and holds its next beat in its stage until granted (a beat asking for no memory is
    taken at once); grants go first to the engines that moved fewer beats than the leader (`urgent`), then to the
    rest, each class in engine order, unless a grant before took one of the beat's memories (`conflicts` False:
    never)."""
    engines = len(requests)
    index, credit, stage = [0] * engines, [0.0] * engines, [0] * engines
    left, cycles = sum(len(asks) for asks in requests), 0
    while left or any(stage):
        cycles += 1
        moved = [index[e] - (stage[e] != 0) for e in range(engines)]
        leader, taken = max(moved), 0
        for e in sorted(range(engines), key=lambda e: moved[e] == leader):    # stable: engine order in a class
            if stage[e] and not (conflicts and stage[e] & taken):
                taken |= stage[e]
                stage[e] = 0
        for e, asks in enumerate(requests):
            credit[e] = min(credit[e] + rate, backlog)
            if index[e] < len(asks) and credit[e] >= 1.0 and not stage[e]:
                stage[e] = asks[index[e]]
                index[e] += 1
                credit[e] -= 1.0
                left -= 1
    return cycles


def dma_figures(cfg, run) -> dict:
    """The grants' extra cycles over the program's LOADs and STOREs between HBM and ABUF/WBUF, at one beat per
    cycle per engine and at the HBM's sustained rate."""
    B = cfg.beat_words
    rates = {"port": 1.0, "hbm": min(1.0, cfg.hbm_bytes_per_cycle / (cfg.hbm_channels * 2 * B))}
    period_x, period_b = cfg.hbm_channels ** 2 * cfg.hbm_interleave_words, period(cfg.buffer_chunk_words, cfg.buffer_banks)
    out = {"transfers": 0, **{f"{rate}_cycles": 0 for rate in rates}, **{f"{rate}_extra": 0 for rate in rates}}
    cache: dict = {}
    for r in run:
        if r is None or r.op not in (Opcode.LOAD, Opcode.STORE) or not (r.rows and r.n) or r.flags.transpose:
            continue
        write = r.op is Opcode.LOAD
        (x_space, x0), (b_space, b0) = (r.src1, r.dst) if write else (r.dst, r.src1)
        x_stride, b_stride = (r.src1_stride, r.dst_stride) if write else (r.dst_stride, r.src1_stride)
        if x_space is not Space.HBM or b_space not in (Space.ABUF, Space.WBUF):
            continue
        key = (r.rows, r.n, x0 % period_x, x_stride, b0 % period_b, b_stride, write)
        if key not in cache:
            requests = engine_requests(cfg, r.rows, r.n, x0 % period_x, x_stride, b0 % period_b, b_stride, write)
            cache[key] = {}
            for label, rate in rates.items():
                free = grant_cycles(requests, rate, conflicts=False)
                cache[key][label] = (free, grant_cycles(requests, rate) - free)
        out["transfers"] += 1
        for label, (free, extra) in cache[key].items():
            out[f"{label}_cycles"] += free
            out[f"{label}_extra"] += extra
    return out


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
    print(f"\nThe units' tiles through one read port per memory (weights, x and bias; vector operands): stalls in "
          "their busy cycles")
    print(f"{'program':34}{'matrix cycles':>15}{'stalls':>18}{'vector cycles':>15}{'stalls':>18}")
    for label, f in report.items():
        print(f"{label:34}" + "".join(f"{f[unit + '_cycles']:>15,}{f[unit + '_stalls']:>10,} "
                                      f"({100 * f[unit + '_stalls'] / max(f[unit + '_cycles'], 1):>4.1f}%)"
                                      for unit in ("matrix", "vector")))
    if not args.no_dma:
        print(f"\nDMA engines' grants (HBM <-> ABUF/WBUF LOADs and STOREs): extra cycles over conflict-free memories")
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
