"""The core's floorplan on the platform's SLRs: which super logic region each unit goes to, chosen so the fewest
signal bits cross an SLR boundary, and the Vivado Tcl that puts the units there (docs/floorplan.md).

    blocks       controller, fetch, the units (dma, matrix, vector, router), abuf and wbuf (hw/core/core.py's
                 instances; BLOCK_PATHS)
    ends         fixed places the blocks connect to: `hbm` and `host` (HBM: the DMA's channels and host buffer,
                 fetch's `prog`; vitis.memory_banks puts every m_axi port in HBM), `ring` (the Aurora kernel in the
                 platform's link SLR; a one-card ring closes on chip, so it has no end) and `control` (the AXI4-Lite
                 registers: KernelTop's own logic, in no submodule, so no pblock places it; taken to sit by the
                 shell's control interconnect)
    connections  bits between two of them, from the Amaranth signatures (connections): each bit is one super long
                 line (SLL) per SLR boundary it crosses
    plan         every assignment of the blocks to SLRs tried (3^8), the fitting one with the fewest SLL bits kept
                 (place); "fits": each SLR's LUT, FF, DSP, BRAM36 and URAM and each boundary's SLLs at most CEILING
                 of its capacity (SLR_CAPACITY)

Figures per block come from scripts/synth_netlist.py's report (`units`, and `parts` for the buffers); the kernel's
own logic and the buffers' wrapper ("kernel and core wiring", buffers less its parts) load the control end's SLR.
Nothing here registers a crossing signal: the RTL does not yet (docs/floorplan.md).

    python -m ringgpt.hw.kernel.floorplan --config u280 --cards 4     # the connections and the plan
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from amaranth.hdl import Shape

from ringgpt.hw.config import ArchConfig, get_config
from ringgpt.hw.core.core import HOST_INPUTS, SETTINGS, STATUS, Core
from ringgpt.hw.errors import RingGPTError
from ringgpt.hw.isa import Space
from ringgpt.hw.netlist import report_path
from ringgpt.hw.resource_estimates import U280_LIMITS

from .kernel import KERNEL_MODULE
from .vitis import DEFAULT_PLATFORM, Platform, instance, platform

FLOORPLAN_TCL = "floorplan.tcl"
RESOURCES = ("LUT", "FF", "DSP", "BRAM36", "URAM")
CEILING = 0.70
"""Utilisation ceiling: the plan keeps every resource of every SLR, and the SLLs of every boundary, at or below 70 %
of SLR_CAPACITY. It stands in for the shell's share, not sourced (SlrCapacity), and for routing room: UG1393 warns
that 10 % can go to system infrastructure and that 100 % is never usable."""
SPACES, BUFFERS = (Space.ABUF, Space.WBUF), "buffers"
BLOCK_PATHS = {"controller": "controller", "fetch": "fetch", "dma": "dma", "matrix": "matrix", "vector": "vector",
               "router": "router", **{space.name.lower(): f"{BUFFERS}/{space.name.lower()}" for space in SPACES}}
"""Each block's instance path under the kernel's `core` (core.py's submodules; Buffers' `abuf` and `wbuf`), which is
also its key in the netlist report: `units` for one name, `parts` for a path."""
WIRING = "kernel and core wiring"
"""The netlist report's unit for the kernel's and the core's own cells."""


class FloorplanError(RingGPTError):
    """Figures the floorplan cannot use (a netlist report without a block, an unknown platform)."""


@dataclass(frozen=True)
class SlrCapacity:
    """What a platform leaves the kernel per SLR, bottom (SLR0) first, and where its fixed ends are.

    `resources`: each SLR's LUT, FF, DSP, BRAM36 and URAM. `slls`: super long lines per boundary of two adjacent
    SLRs. `hbm_slr`: where HBM and its AXI ports are; `control_slr`: where the shell's control bus comes from.
    `pblocks`: the platform's pblock of the dynamic region in each SLR. `sources`: where each number comes from."""
    slrs: tuple[str, ...]
    resources: dict
    slls: int
    hbm_slr: str
    control_slr: str
    pblocks: dict
    sources: str


_U280_SLRS = ("SLR0", "SLR1", "SLR2")
SLR_CAPACITY = {DEFAULT_PLATFORM: SlrCapacity(
    slrs=_U280_SLRS,
    resources={slr: {key: U280_LIMITS[key] // len(_U280_SLRS) for key in RESOURCES} for slr in _U280_SLRS},
    slls=23_040, hbm_slr="SLR0", control_slr="SLR0",
    pblocks={slr: f"pblock_dynamic_{slr}" for slr in _U280_SLRS},
    sources="resources: a third of the XCU280's totals (hw/resource_estimates.py U280_LIMITS, from the DS963 Alveo "
            "U280 data sheet) per SLR, the three SLRs taken as equal; the platform's static region (PCIe, XDMA, HBM "
            "and clocking, mostly in SLR0) is NOT deducted: no AMD document found gives this platform's per-SLR "
            "figures (`platforminfo --verbose -p xilinx_u280_gen3x16_xdma_1_202211_1` prints them, UG1393 "
            "'Resource Availability'), so CEILING stands in for it. slls: 23,040 per boundary is NOT sourced from an "
            "AMD document for the XCU280 (UG949 'Super Long Line (SLL) Routes' gives only the query, "
            "`get_property NUM_TOP_SLLS [get_slrs SLR0]`, which floorplan.tcl runs and compares). hbm_slr: the "
            "HBM stacks and their 32 AXI ports are at SLR0's edge (UG1314 Alveo U280 user guide). control_slr: the "
            "static region (PCIe) is in SLR0 (UG1120). pblocks: pblock_dynamic_SLR<n>, the names Xilinx's Vitis "
            "examples add kernel cells to (add_cells_to_pblock pblock_dynamic_SLR0 ...).")}
"""Per platform name (vitis.PLATFORMS): the SLR facts the floorplan uses, each with its source."""


def capacity(target: Platform) -> SlrCapacity:
    if target.name not in SLR_CAPACITY:
        raise FloorplanError(f"no SLR capacities for Vitis platform {target.name!r}: add them to "
                             "ringgpt.hw.kernel.floorplan.SLR_CAPACITY (platforminfo --verbose lists them)")
    return SLR_CAPACITY[target.name]


# --- connections, from the signatures ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Connection:
    a: str
    b: str
    bits: int
    ports: tuple[str, ...]
    """The members that make it up (as the unit or controller names them)."""


def bits(member) -> int:
    """Wires of a signature member, a port member, or a Signature: every port flattened, each direction counted."""
    signature = member if not hasattr(member, "is_signature") else member.signature if member.is_signature else None
    if signature is None:
        return Shape.cast(member.shape).width
    return sum(Shape.cast(port.shape).width for _, port in signature.members.flatten() if port.is_port)


@functools.cache
def _core(cfg: ArchConfig) -> Core:
    core = Core(cfg)    # constructed, never elaborated: its members are all the floorplan reads
    for part in (core, core.controller, core.fetch, *core.units.values()):
        part._MustUse__silence = True
    return core


def connections(cfg: ArchConfig) -> list[Connection]:
    """Every connection between blocks and ends at `cfg`, one per pair, with its bits (see the module docstring)."""
    core = _core(cfg)
    fetch, units = core.fetch.signature.members, core.units
    wires = [("controller", "fetch", "control", bits(fetch["control"])), ("fetch", "hbm", "prog", bits(fetch["prog"]))]
    for name, unit in units.items():
        members = unit.signature.members
        wires += [("controller", name, port, bits(members[port])) for port in ("issue", "status")]
        wires += [(name, space.name.lower(), port, bits(sig)) for port, (space, sig) in unit.buffer_ports.items()]
    dma = units["dma"]
    wires += [("dma", "host" if port == "host" else "hbm", port, bits(dma.signature.members[port]))
              for port in dma.ports]
    if cfg.cards > 1:
        router = units["router"].signature.members
        wires += [("router", "ring", port, bits(router[port])) for port in ("tx", "rx")]
    owners = {"controller": core.controller, **units}
    for port in HOST_INPUTS + STATUS + SETTINGS:
        owner = [name for name, part in owners.items() if port in part.signature.members]
        if len(owner) != 1:
            raise FloorplanError(f"host-interface member {port!r} is on {owner or 'no block'}, not on one block: "
                                 "ringgpt.hw.kernel.floorplan.connections needs its owner")
        wires.append(("control", owner[0], port, bits(owners[owner[0]].signature.members[port])))
    pairs = {}
    for a, b, port, width in wires:
        total, ports = pairs.get((a, b), (0, ()))
        pairs[a, b] = (total + width, ports + (port,))
    return [Connection(a, b, width, ports) for (a, b), (width, ports) in pairs.items()]


def ends(cfg: ArchConfig, target: Platform) -> dict[str, str]:
    """The fixed ends' SLRs (`ring` only for rings of 2+ cards)."""
    slrs = capacity(target)
    out = {"hbm": slrs.hbm_slr, "host": slrs.hbm_slr, "control": slrs.control_slr}
    return out | ({"ring": target.link_slr} if cfg.cards > 1 else {})


# --- figures, from the netlist report ------------------------------------------------------------------------------

def figures(report: dict, source: str) -> tuple[dict, dict]:
    """(each block's figures, the fixed load at the control end) from a scripts/synth_netlist.py report."""
    units, parts = report.get("units"), report.get("parts")
    if not isinstance(units, dict) or not isinstance(parts, dict):
        raise FloorplanError(f"{source} has no `units` and `parts`: not a scripts/synth_netlist.py report; "
                             "run it again")
    blocks = {}
    for block, path in BLOCK_PATHS.items():
        row = (parts if "/" in path else units).get(path)
        if not isinstance(row, dict):
            raise FloorplanError(f"{source} has no figures for {path!r} ({'parts' if '/' in path else 'units'}): "
                                 "write it again with scripts/synth_netlist.py")
        blocks[block] = {key: row.get(key, 0) for key in RESOURCES}
    buffers, wiring = units.get(BUFFERS), units.get(WIRING, {})
    wrapper = {key: buffers.get(key, 0) - sum(blocks[s.name.lower()][key] for s in SPACES) for key in RESOURCES} \
        if isinstance(buffers, dict) else {}
    return blocks, {key: wiring.get(key, 0) + wrapper.get(key, 0) for key in RESOURCES}


# --- the plan ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """An assignment of every block to an SLR, with what it uses against what it may (CEILING of the capacity).
    `problems` is empty when it fits; else it says what overflows (the assignment then is the one that overflows
    least)."""
    assignment: dict
    ends: dict
    loads: dict
    limits: dict
    sll: dict
    """Bits over each boundary ('SLR0-SLR1', ...)."""
    sll_limit: float
    crossing: tuple
    """(connection, boundaries crossed) of each connection whose ends lie in different SLRs."""
    problems: tuple

    @property
    def fits(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"fits": self.fits, "problems": list(self.problems), "ceiling": CEILING,
                "assignment": self.assignment, "ends": self.ends,
                "slrs": {slr: {key: [round(self.loads[slr][key]), round(self.limits[slr][key])] for key in RESOURCES}
                         for slr in self.loads},
                "sll": {boundary: [used, round(self.sll_limit)] for boundary, used in self.sll.items()},
                "crossing_bits": sum(c.bits for c, _ in self.crossing),
                "crossing": [{"between": [c.a, c.b], "bits": c.bits, "boundaries": hops} for c, hops in self.crossing]}

    def summary(self) -> str:
        """One line: where each block goes, the SLLs per boundary against their limit, the fullest SLR."""
        by_slr = {slr: [b for b, s in self.assignment.items() if s == slr] for slr in self.loads}
        where = "; ".join(f"{slr} {', '.join(blocks)}" for slr, blocks in by_slr.items() if blocks)
        sll = ", ".join(f"{used:,}/{self.sll_limit:,.0f} {boundary}" for boundary, used in self.sll.items())
        slr, key = max(((s, k) for s in self.loads for k in RESOURCES),
                       key=lambda sk: _share(self.loads[sk[0]][sk[1]], self.limits[sk[0]][sk[1]]))
        share = 100 * _share(self.loads[slr][key], self.limits[slr][key])
        verdict = "fits" if self.fits else "does NOT fit: " + "; ".join(self.problems)
        return (f"{verdict}. {where}; SLL bits {sll}; fullest {slr} {key} at {share:.0f} % of its "
                f"{100 * CEILING:.0f} % ceiling")


def _share(used: float, limit: float) -> float:
    """`used` as a share of `limit` (anything in nothing: infinite)."""
    return used / limit if limit else float("inf") if used else 0.0


def place(links: list[Connection], blocks: dict, fixed: dict, fixed_ends: dict, slrs: SlrCapacity,
          ceiling: float = CEILING) -> Plan:
    """Tries every assignment of `blocks` (name -> figures) to the SLRs of `slrs` with the ends at `fixed_ends` and
    `fixed` (figures) loading the control end's SLR; keeps the fitting one with the fewest SLL bits (ties: the
    lower peak share), else the one whose worst overflow is least, saying what overflows."""
    names, order = list(blocks), slrs.slrs
    limits = {slr: {key: ceiling * slrs.resources[slr][key] for key in RESOURCES} for slr in order}
    sll_limit = ceiling * slrs.slls
    boundaries = [f"{low}-{high}" for low, high in zip(order, order[1:])]
    best = None
    for choice in itertools.product(range(len(order)), repeat=len(names)):
        at = dict(zip(names, choice)) | {end: order.index(slr) for end, slr in fixed_ends.items()}
        loads = [dict.fromkeys(RESOURCES, 0) for _ in order]
        for key in RESOURCES:
            loads[at["control"]][key] += fixed[key]
            for name in names:
                loads[at[name]][key] += blocks[name][key]
        sll = [0] * len(boundaries)
        for link in links:
            low, high = sorted((at[link.a], at[link.b]))
            for boundary in range(low, high):
                sll[boundary] += link.bits
        worst = max([_share(loads[i][key], limits[slr][key]) for i, slr in enumerate(order) for key in RESOURCES] +
                    [_share(used, sll_limit) for used in sll])
        rank = (worst > 1, sum(sll) if worst <= 1 else worst, worst)
        if best is None or rank < best[0]:
            best = (rank, choice, loads, sll)
    _, choice, loads, sll = best
    assignment = {name: order[i] for name, i in zip(names, choice)}
    at = {**assignment, **fixed_ends}
    inside = {slr: ", ".join(n for n in names if assignment[n] == slr) or "nothing" for slr in order}
    problems = [f"{slr} {key} {loads[i][key]:,.0f} > {limits[slr][key]:,.0f} by "
                f"{loads[i][key] - limits[slr][key]:,.0f} ({inside[slr]})"
                for i, slr in enumerate(order) for key in RESOURCES if loads[i][key] > limits[slr][key]]
    problems += [f"{boundary} SLLs {used:,} > {sll_limit:,.0f} by {used - sll_limit:,.0f}"
                 for boundary, used in zip(boundaries, sll) if used > sll_limit]
    crossing = tuple((link, abs(order.index(at[link.a]) - order.index(at[link.b]))) for link in links
                     if at[link.a] != at[link.b])
    return Plan(assignment=assignment, ends=dict(fixed_ends), loads=dict(zip(order, loads)), limits=limits,
                sll=dict(zip(boundaries, sll)), sll_limit=sll_limit, crossing=crossing, problems=tuple(problems))


def plan(cfg: ArchConfig, target: Platform, report: dict, source: str) -> Plan:
    """The floorplan of `cfg`'s core on `target` from a netlist report (read from `source`)."""
    blocks, fixed = figures(report, source)
    return place(connections(cfg), blocks, fixed, ends(cfg, target), capacity(target))


# --- Vivado ----------------------------------------------------------------------------------------------------------

def floorplan_tcl(cfg: ArchConfig, target: Platform, chosen: Plan) -> str:
    """Vivado Tcl, run before opt_design (vitis.link_config): each block's instance into its SLR's pblock of the
    dynamic region; an error naming the block when its instance is not found exactly once; the device's SLLs per
    boundary compared with SLR_CAPACITY's."""
    cu, slrs = instance(KERNEL_MODULE), capacity(target)
    lines = [f"# Generated by ringgpt (hw/kernel/floorplan.py) for config {cfg.name} (hash {cfg.hash}) on "
             f"{target.name}.",
             "# The core's units in the platform's pblocks, one SLR each; run by v++ before opt_design (link.cfg).",
             f"# Plan: {chosen.summary()}",
             "proc ringgpt_block {path} {",
             f'    set cells [get_cells -quiet -hierarchical -filter "NAME =~ */{cu}/core/$path || '
             f'NAME =~ */{cu}/*/core/$path"]',
             "    if {[llength $cells] != 1} {",
             f'        error "ringgpt floorplan: [llength $cells] cells named */{cu}/.../core/$path, not 1 (a '
             'flattened or renamed hierarchy?)"',
             "    }", "    return $cells", "}",
             "proc ringgpt_pblock {name} {", "    set pblock [get_pblocks -quiet $name]",
             "    if {[llength $pblock] != 1} {",
             f'        error "ringgpt floorplan: no pblock $name in {target.name}"', "    }", "    return $pblock", "}"]
    lines += [f"add_cells_to_pblock [ringgpt_pblock {slrs.pblocks[slr]}] [ringgpt_block {BLOCK_PATHS[block]}] "
              "-clear_locs" for block, slr in chosen.assignment.items()]
    for low in slrs.slrs[:-1]:
        lines += [f"set slls [get_property NUM_TOP_SLLS [get_slrs {low}]]",
                  f"if {{$slls != {slrs.slls}}} {{",
                  f'    puts "WARNING: ringgpt floorplan: {low} has $slls SLLs above it; the plan assumed {slrs.slls}"',
                  "}"]
    return "\n".join(lines) + "\n"


# --- command line ----------------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="u280", help="architecture preset (default %(default)s)")
    parser.add_argument("--cards", type=int, default=None, help="cards on the ring (default 1)")
    parser.add_argument("--platform", default=DEFAULT_PLATFORM, help="Vitis platform (default %(default)s)")
    parser.add_argument("--netlist", type=Path, default=None,
                        help="scripts/synth_netlist.py report (default docs/bench/<config>_netlist.json)")
    args = parser.parse_args(argv)
    try:
        cfg, target = get_config(args.config, args.cards), platform(args.platform)
        preset = args.config.partition("-x")[0]
        print(f"{'between':24}{'bits':>10}  ports")
        for link in connections(cfg):
            ports = link.ports if len(link.ports) < 5 else \
                (link.ports[0], "...", f"{link.ports[-1]} ({len(link.ports)})")
            print(f"{link.a + ' - ' + link.b:24}{link.bits:>10,}  {', '.join(ports)}")
        print(f"ends: {', '.join(f'{end} {slr}' for end, slr in ends(cfg, target).items())}")
        source = args.netlist or report_path(preset)
        if not source.is_file():
            print(f"floorplan not checked: {source} absent (python scripts/synth_netlist.py --config {preset} "
                  "writes it)")
            return 0
        print(f"floorplan: {plan(cfg, target, read_report(source), str(source)).summary()}")
    except RingGPTError as exc:
        print(f"floorplan: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def read_report(path: Path) -> dict:
    """A netlist report, or a FloorplanError saying why it cannot be read."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FloorplanError(f"cannot read the netlist report {path}: {exc}; write it again with "
                             "scripts/synth_netlist.py") from None
    if not isinstance(report, dict):
        raise FloorplanError(f"{path} is not a scripts/synth_netlist.py report (not a JSON object)")
    return report


if __name__ == "__main__":
    sys.exit(main())
