#!/usr/bin/env python3
"""The whole Alveo kernel (hw/kernel/kernel.py's KernelTop around one core) of a config, synthesised by Yosys
`synth_xilinx -family xcup` module by module (hw/netlist.py), with its logic depth (hw/netlist_depth.py).

Every unique module (by the digest of its RTLIL, its children replaced by theirs) is synthesised once with its
children as black boxes and counted once per instance; the figures are the modules' own cells, nothing composed
by hand. Each module's record is cached in --cache as <digest>.json, so a second run synthesises only what changed.
Writes --out (default docs/bench/<config>_netlist.json): `total` and per-unit LUT, FF, DSP, BRAM36, URAM, MUXF7,
MUXF8 and their share of the U280, `max_logic_levels` (register to register across modules, the top's ports
counted as registers) with the ten deepest paths, a histogram of register inputs by levels within their modules,
the nets read by more than 1,000 cell pins, the Yosys version and the design digest.

    python scripts/synth_netlist.py --config u280            # native yosys; 2 jobs
    python scripts/synth_netlist.py --config sim-small --out /tmp/sim-small_netlist.json
    python scripts/synth_netlist.py --config u280 --buffer ABUF   # one buffer alone, with the core's ports

--buffer synthesises one of the core's buffers (hw/resource_estimates.core_buffers: its memories and port logic,
as the kernel has them) by the same flow and cache, and prints its figures (11-14 minutes for ABUF at u280), a
quick measure of a change to the buffers before the whole kernel's.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from amaranth.back import rtlil

from ringgpt.hw import netlist
from ringgpt.hw.config import PRESETS, get_config
from ringgpt.hw.netlist_depth import compose
from ringgpt.hw.resource_estimates import U280_LIMITS

ROOT = Path(__file__).resolve().parents[1]


def kernel_rtlil(config: str) -> str:
    from ringgpt.hw.kernel.kernel import KernelTop
    return rtlil.convert(KernelTop(get_config(config)), name="top", emit_src=False)


def buffer_rtlil(config: str, buffer: str) -> str:
    from ringgpt.hw.isa import Space
    from ringgpt.hw.resource_estimates import core_buffers
    return rtlil.convert(core_buffers(get_config(config)).banked(Space[buffer]), name="top", emit_src=False)


def synthesise(modules: dict, digests: dict, cache: Path, yosys: list, version: str, jobs: int) -> list:
    """Synthesises the unique modules not in `cache`, `jobs` at once; returns the failures."""
    todo = netlist.jobs_for(modules, digests, cache, yosys, version)
    print(f"{len(modules)} modules, {len(set(digests.values()))} unique, {len(todo)} to synthesise", flush=True)
    failed = []
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        running = {pool.submit(netlist.synthesise_unique, job): job["name"] for job in todo.values()}
        for done in as_completed(running):
            try:
                record = done.result()
            except (RuntimeError, ValueError, OSError) as exc:
                failed.append(f"{running[done]}: {exc}")
                print(f"  {failed[-1]}", flush=True)
                continue
            print(f"  {running[done]}: {record['figures']['LUT']:,} LUTs, {record['seconds']} s", flush=True)
    if failed:
        print(f"synth_netlist: {len(failed)} module(s) failed ({failed[0]}); the others are cached in {cache}: "
              "fix the cause and run again", file=sys.stderr)
    return failed


def report(modules: dict, digests: dict, records: dict, config: str, version: str, seconds: dict) -> dict:
    """The JSON report from every module's record (by digest)."""
    own = {name: records[digests[name]]["figures"] for name in modules}
    paths = netlist.instance_tree(modules)
    summed = netlist.totals(modules, own)
    units = {path.split("/")[-1]: summed[path] for path in paths if path.count("/") == 2 and path.startswith("top/core/")}
    glue = {key: own["\\top"][key] + own[paths["top/core"]][key] for key in own["\\top"]}
    units["kernel and core wiring"] = glue
    parts = {path[len("top/core/"):]: summed[path] for path in paths if path.count("/") == 3}
    children_of = {path: {instance.lstrip("\\"): f"{path}/{instance.lstrip(chr(92))}"
                          for instance in modules[name].children} for path, name in paths.items()}
    arcs_of = {digest: {"arcs": [[a, b, n] for a, b, n in record["arcs"]]} for digest, record in records.items()}
    depth = compose({path: digests[name] for path, name in paths.items()}, arcs_of, children_of)
    names = {}                                     # instance path -> {port index: port name}

    def readable(pin: str) -> str:
        path, _, port = pin.rpartition(":")
        if path not in paths or not port.isdigit():
            return pin
        if path not in names:
            names[path] = {index: name for name, index in modules[paths[path]].port_indices().items()}
        return f"{path}.{names[path].get(port, port)}"

    deepest = []
    for found in depth["deepest"]:
        through = [readable(pin) for pin in found["through"]]
        entry = {"levels": found["levels"], "through": through}
        first, last = found["through"][0].rpartition(":")[0], found["through"][-1].rpartition(":")[0]
        if first == last and len(through) == 2:          # within one module: its own deepest path's names
            own_path = records[digests[paths[first]]]["deepest"][:1]
            entry["registers"] = own_path[0] if own_path else None
        deepest.append(entry)
    histogram: dict[int, int] = defaultdict(int)
    fanout = []
    for path, name in paths.items():
        record = records[digests[name]]
        for levels, count in record["histogram"].items():
            histogram[int(levels)] += count
        fanout += [{"instance": path, **net} for net in record["high_fanout"]]
    total = summed["top"]
    unique = {digests[name] for name in modules}
    return {
        "config": config, "flow": netlist.FLOW, "yosys": version, "design_digest": digests["\\top"],
        "modules": len(modules), "unique_modules": len(unique),
        "synthesis_seconds": {"wall": seconds["wall"], "modules_total": round(sum(
            records[d]["seconds"] for d in unique), 1), "rtlil": seconds["rtlil"]},
        "total": total, "share_of_u280_percent": netlist.share(total), "limits": U280_LIMITS,
        "units": units, "parts": parts,
        "max_logic_levels": depth["max_logic_levels"],
        "depth_basis": "LUT levels register to register across modules: each module's arcs between its ports, "
                       "children's pins and registers at port granularity, joined along the hierarchy (an upper "
                       "bound of the bit-level depth); carry chains count one level, MUXF7/8/9 none; the "
                       "kernel's own ports count as registers",
        "deepest_paths": deepest, "port_loops": depth["port_loops"],
        "structural_loops_entered": {path: records[digests[name]]["loop_breaks"] for path, name in paths.items()
                                     if records[digests[name]]["loop_breaks"]},
        "register_inputs_by_levels_within_modules": dict(sorted(histogram.items())),
        "high_fanout_limit": netlist.FANOUT_LIMIT, "high_fanout_nets": len(fanout),
        "high_fanout": sorted(fanout, key=lambda x: -x["loads"])[:20],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="u280", choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, help="report JSON (default docs/bench/<config>_netlist.json)")
    parser.add_argument("--cache", type=Path, default=ROOT / "out" / "netlist", help="module records by digest")
    parser.add_argument("--jobs", type=int, default=2, help="Yosys runs at once (default 2)")
    parser.add_argument("--buffer", choices=("ABUF", "WBUF"), help="synthesise this buffer alone and print its figures")
    args = parser.parse_args(argv)
    out = args.out or netlist.report_path(args.config)
    try:
        yosys, version = netlist.yosys_command()
    except RuntimeError as exc:
        print(f"synth_netlist: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    what = f"the {args.config} {args.buffer or 'kernel'}"
    print(f"{version}; converting {what} to RTLIL", flush=True)
    modules = netlist.split_modules(buffer_rtlil(args.config, args.buffer) if args.buffer else
                                    kernel_rtlil(args.config))
    digests = netlist.module_digests(modules)
    rtlil_s = round(time.monotonic() - started, 1)
    print(f"RTLIL in {rtlil_s} s", flush=True)
    if synthesise(modules, digests, args.cache, yosys, version, args.jobs):
        return 1
    records = {digest: netlist.cached(args.cache, digest, version) for digest in set(digests.values())}
    if args.buffer:
        total = netlist.totals(modules, {name: records[digests[name]]["figures"] for name in modules})["top"]
        print(f"{what}: " + ", ".join(f"{key} {total[key]:,}" for key in total) +
              f" ({round(time.monotonic() - started)} s)")
        return 0
    result = report(modules, digests, records, args.config, version,
                    {"wall": round(time.monotonic() - started, 1), "rtlil": rtlil_s})
    netlist.write_atomically(out, json.dumps(result, indent=1) + "\n")
    share = result["share_of_u280_percent"]
    print(f"{'unit':28}" + "".join(f"{k:>10}" for k in U280_LIMITS))
    for name, row in {**result["units"], "total": result["total"]}.items():
        print(f"{name:28}" + "".join(f"{round(row.get(k, 0)):>10,}" for k in U280_LIMITS))
    print(f"{'share of the U280 (%)':28}" + "".join(f"{share[k]:>10}" for k in U280_LIMITS))
    print(f"max logic levels {result['max_logic_levels']}; {result['high_fanout_nets']} nets over "
          f"{netlist.FANOUT_LIMIT} loads; wrote {out} in {result['synthesis_seconds']['wall']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
