#!/usr/bin/env python3
"""Resource estimates of the arithmetic units and the core's units for Xilinx UltraScale+ (the U280's family).

The command line of hw/resource_estimates.py (what is synthesised, what is composed and why: its docstring).
Prints a table and writes JSON: `python scripts/resource_estimates.py [--only NAME ...]` (out/resource_estimates.json,
the arithmetic units at the u280 preset's widths), `--core [--reuse]` (out/core_estimates.json, the core's units
against the U280's limits), `--check-buffers PRESET` (a preset's whole buffers beside their composition).
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
