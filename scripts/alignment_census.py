#!/usr/bin/env python3
"""How the compiled GPT-2 programs address the on-chip buffers: every ABUF and WBUF block each executed instruction
reads or writes (hw/resolved.access_blocks), sorted into the kinds a buffer port has to serve.

    python scripts/alignment_census.py --model gpt2-124m --config u280 --cards 1
    python scripts/alignment_census.py --model gpt2-1.5b --cards 4 --json out/alignment_census.json

A buffer port that may start anywhere reads two rows of two memories and shifts the words it wants out of them
(hw/core/buffers.py: a 17-way choice of two 64-word rows and a 64-word shift per port at u280, docs/rtl-core.md); one
whose operands start on a chunk boundary reads one row, and one that moves a single word picks it out of one row.
The kinds:

* `aligned`: the block's first word and (with more than one row) its row stride are multiples of the buffer chunk;
* `single`: one word per row (row scalars, reductions' results), anywhere;
* `engine`: written or read by the DMA's port engines (LOAD/GATHER from, STORE to HBM or the host), which move whole
  rows and beats under the beat rule (hw/resolved.misaligned_transfer) whatever the buffer address;
* `misaligned`: the rest, which only a shifting port serves.

Timing-only runs (SimulatorDevice(compute=False), as scripts/bench_appliance.py's): a prompt of --prompt tokens and
one decode step, every card. Prints a table per (opcode, operand, space) and the first misaligned blocks.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.models import synthetic_config
from ringgpt.host.runtime import Appliance
from ringgpt.hw.config import PRESETS, ArchConfig, get_config
from ringgpt.hw.errors import RingGPTError
from ringgpt.hw.isa import Opcode, Space
from ringgpt.hw.resolved import Block, Resolved, access_blocks
from ringgpt.sim.functional import SimulatorDevice

KINDS = ("aligned", "single", "engine", "misaligned")
BUFFERS = (Space.ABUF, Space.WBUF)
OFF_CHIP = (Space.HBM, Space.HOST)


def kind(r: Resolved, block: Block, chunk: int) -> str:
    """The kind of buffer block `block` of instruction `r` (see the module docstring)."""
    engine_side = (block.operand == "dst" and r.op in (Opcode.LOAD, Opcode.GATHER) and r.src1[0] in OFF_CHIP) or \
                  (block.operand == "src1" and r.op is Opcode.STORE and r.dst[0] in OFF_CHIP)
    if engine_side:
        return "engine"
    if block.base % chunk == 0 and (block.rows == 1 or block.stride % chunk == 0):
        return "aligned"
    return "single" if block.cols == 1 else "misaligned"


def census(traces: list, cfg: ArchConfig, examples: int = 8) -> tuple[dict, list]:
    """({(opcode, operand, space): Counter of kinds}, the first `examples` misaligned blocks) over the traces'
    instructions (lists of Resolved, one per card)."""
    counts: dict = {}
    found = []
    for card, trace in enumerate(traces):
        for r in trace:
            reads, writes = access_blocks(r)
            for block in (*reads, *writes):
                if block.space not in BUFFERS or block.empty:
                    continue
                sort = kind(r, block, cfg.buffer_chunk_words)
                counts.setdefault((r.op.name, block.operand, block.space.name), Counter())[sort] += 1
                if sort == "misaligned" and len(found) < examples:
                    found.append({"card": card, "op": r.op.name, "operand": block.operand, "space": block.space.name,
                                  "base": block.base, "rows": block.rows, "cols": block.cols, "stride": block.stride})
    return counts, found


def run_traces(model_size: str, cfg: ArchConfig, prompt: int, max_context: int) -> list:
    """The traces of a timing-only prompt run of `prompt` tokens and one decode step, all cards, one after the other."""
    import torch
    from transformers import GPT2LMHeadModel
    with torch.device("meta"):
        model = GPT2LMHeadModel(synthetic_config(model_size))
    device = SimulatorDevice(cfg, compute=False)
    appliance = Appliance(device, compile_model(model, cfg, max_context))
    traces = [[] for _ in range(cfg.cards)]
    for pos, tokens in ((0, [0] * prompt), (prompt, [0])):
        appliance.run(pos, tokens)
        for mine, card in zip(traces, device.cards):
            mine.extend(card.trace)
    return traces


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-124m", help="GPT-2 size (gpt2-124m, gpt2-355m, gpt2-774m, gpt2-1.5b) or a synthetic spec (n_layer=2,n_embd=128,n_head=2)")
    parser.add_argument("--config", default="u280", choices=sorted(PRESETS))
    parser.add_argument("--cards", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=8, help="prompt tokens (default 8); then one decode step")
    parser.add_argument("--max-context", type=int, default=256)
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args(argv)
    try:
        cfg = get_config(args.config, args.cards)
        traces = run_traces(args.model, cfg, args.prompt, args.max_context)
    except (RingGPTError, ValueError) as exc:
        print(f"alignment_census: {exc}", file=sys.stderr)
        return 2
    counts, found = census(traces, cfg)
    totals = sum(counts.values(), Counter())
    print(f"{args.model} on {cfg.cards} x {cfg.name}, chunk {cfg.buffer_chunk_words} words: buffer blocks by kind")
    print(f"{'opcode operand space':34}" + "".join(f"{k:>12}" for k in KINDS))
    for key in sorted(counts):
        print(f"{' '.join(key):34}" + "".join(f"{counts[key][k]:>12,}" for k in KINDS))
    print(f"{'all':34}" + "".join(f"{totals[k]:>12,}" for k in KINDS))
    for example in found:
        print("misaligned:", example)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": args.model, "config": cfg.name, "chunk": cfg.buffer_chunk_words,
                                         "counts": {" ".join(k): dict(v) for k, v in sorted(counts.items())},
                                         "misaligned_examples": found}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
