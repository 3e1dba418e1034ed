#!/usr/bin/env python3
"""Resource estimates of the arithmetic units and the core's units for Xilinx UltraScale+ (the U280's family).

Each unit is converted to RTLIL by Amaranth and synthesised out of context by Yosys
(`synth_xilinx -family xcup -flatten -noiopad -noclkbuf`, the YoWASP build, since Amaranth's
builtin Yosys has no Xilinx flow). Prints a table and writes JSON (default out/resource_estimates.json).
Widths come from the `u280` architecture preset. Run: python scripts/resource_estimates.py [--only NAME ...]

`--core` estimates the core's units at the u280 preset against the U280's limits (writes
out/core_estimates.json): the on-chip DMA is synthesised whole; the matrix and vector units are composed
from their parts (a whole u280 unit is hours of Yosys: one 64-wide MAC tree alone takes about five
minutes), each part synthesised at its u280 width and counted as many times as the unit instantiates it,
plus the control and glue measured as (whole unit - its parts) at the sim-small preset; the buffers are
counted, not synthesised (`buffer_estimate`): each read port outside a group that shares one port per memory
is a full copy of the buffer's memories (buffer_banks memories of buffer_chunk_words-word rows), mapped to
URAM288 (4K x 72) or RAMB36 (512 x 72), and their port logic is composed per requester of the shared groups
from the buffers' own selects and shifts, each synthesised on its own at u280 width (`port_parts`, `port_logic`).
The router, the fetch unit and the controller's scoreboard are synthesised whole at the target's widths, the rest of
the controller (whole less its scoreboard) at sim-small.
`--check-buffers PRESET` synthesises a preset's whole buffers beside that composition.
The estimates themselves are hw/resource_estimates.py; this is their command line.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from ringgpt.hw.config import PRESETS, get_config
from ringgpt.hw.resource_estimates import SYNTH, check_buffers, core_estimates, summarise, synthesise, units

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="report names to synthesise (default: all)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--core", action="store_true", help="the core's units at u280 against the U280 (see above)")
    parser.add_argument("--reuse", action="store_true",
                        help="with --core: reuse an earlier JSON's figures of the parts whose design is unchanged")
    parser.add_argument("--check-buffers", metavar="PRESET", choices=sorted(PRESETS),
                        help="synthesise the core's ABUF and WBUF with all their ports at PRESET and print the figures "
                             "beside port_logic's composition (sim-small: about 15 minutes)")
    args = parser.parse_args(argv)
    if args.check_buffers:
        return check_buffers(get_config(args.check_buffers))
    if args.core:
        return core_estimates(args.json or ROOT / "out" / "core_estimates.json", reuse=args.reuse)
    args.json = args.json or ROOT / "out" / "resource_estimates.json"
    selected = {name: build for name, build in units().items() if not args.only or name in args.only}
    report = {"flow": f"Yosys {SYNTH}", "preset": "u280", "units": {}}
    columns = ("LUT", "LUT_memory", "FF", "CARRY", "DSP48E2", "RAMB36E2", "RAMB18E2")
    print(f"{'unit':28}{'latency':>8}" + "".join(f"{c:>11}" for c in columns))
    for name, build in selected.items():
        unit = build()
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="ringgpt-synth-") as tmp:
            cells = synthesise(unit, Path(tmp))
        figures = summarise(cells)
        report["units"][name] = {"latency": unit.latency, **figures, "cells": cells,
                                 "synthesis_seconds": round(time.monotonic() - started, 1)}
        print(f"{name:28}{unit.latency:>8}" + "".join(f"{figures[c]:>11}" for c in columns), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
