"""hw/netlist.py and hw/netlist_depth.py (scripts/synth_netlist.py's whole-netlist synthesis): identical instances
found by digest, figures summed along the hierarchy, logic levels counted on hand-made netlists, and one real Yosys
run on a small design."""
import json
import subprocess
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Cat, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw import netlist, verilog
from ringgpt.hw.netlist_depth import SEQ, compose, module_arcs


class Adder(wiring.Component):
    def __init__(self, width: int):
        self.width = width
        super().__init__({"a": In(width), "b": In(width), "y": Out(width)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.y.eq(self.a + self.b)
        return m


class Pair(wiring.Component):
    """Two 8-bit adders (identical) and a 16-bit one."""
    def __init__(self):
        super().__init__({"a": In(8), "b": In(8), "y": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.first, m.submodules.second, m.submodules.wide = Adder(8), Adder(8), Adder(16)
        for adder in (m.submodules.first, m.submodules.second):
            m.d.comb += [adder.a.eq(self.a), adder.b.eq(self.b)]
        m.d.comb += [m.submodules.wide.a.eq(m.submodules.first.y), m.submodules.wide.b.eq(m.submodules.second.y),
                     self.y.eq(m.submodules.wide.y)]
        return m


def pair_modules():
    return netlist.split_modules(rtlil.convert(Pair(), name="top", emit_src=False))


def test_identical_instances_share_a_digest_and_are_counted_per_instance():
    modules = pair_modules()
    digests = netlist.module_digests(modules)
    assert digests["\\top.first"] == digests["\\top.second"] != digests["\\top.wide"]
    assert len(set(digests.values())) == 3
    paths = netlist.instance_tree(modules)
    assert paths == {"top": "\\top", "top/first": "\\top.first", "top/second": "\\top.second", "top/wide": "\\top.wide"}
    own = {"\\top": {"LUT": 1}, "\\top.first": {"LUT": 10}, "\\top.second": {"LUT": 10}, "\\top.wide": {"LUT": 20}}
    summed = netlist.totals(modules, own)
    assert summed["top"] == {"LUT": 41} and summed["top/wide"] == {"LUT": 20}


def _module(name: str, *body: str) -> netlist.RtlilModule:
    return netlist.RtlilModule(name, [f"module {name}", *body, "end"])


def test_digests_ignore_global_numbers_even_where_a_port_and_a_wire_share_one():
    # the same module twice, its global numbers shifted; in the first, 10 is both the port's number and a wire's
    first = _module("\\a", "  wire width 8 input 1 \\port$10$0", "  wire width 8 $12", "  wire width 8 $10",
                    "  connect $12 \\port$10$0", "  connect $10 $12")
    second = _module("\\b", "  wire width 8 input 1 \\port$20$0", "  wire width 8 $22", "  wire width 8 $21",
                     "  connect $22 \\port$20$0", "  connect $21 $22")
    rewired = _module("\\c", "  wire width 8 input 1 \\port$20$0", "  wire width 8 $22", "  wire width 8 $21",
                      "  connect $22 \\port$20$0", "  connect $22 $21")
    renamed = _module("\\d", "  wire width 8 input 1 \\other$20$0", "  wire width 8 $22", "  wire width 8 $21",
                      "  connect $22 \\other$20$0", "  connect $21 $22")
    digests = netlist.module_digests({m.name: m for m in (first, second, rewired, renamed)})
    assert digests["\\a"] == digests["\\b"]
    assert len({digests["\\b"], digests["\\c"], digests["\\d"]}) == 3     # a connection or a name changed


def _cell(kind, ins: dict, outs: dict, params=None):
    return {"type": kind, "parameters": params or {}, "port_directions": {**{p: "input" for p in ins},
                                                                          **{p: "output" for p in outs}},
            "connections": {**ins, **outs}}


def test_levels_count_luts_and_a_carry_chain_once():
    # register 2 -> LUT -> LUT -> 8-bit carry chain of two CARRY4 -> LUT -> register; input port a -> LUT -> output y
    cells = {
        "r0": _cell("FDRE", {"D": [30], "C": [1], "CE": ["1"], "R": ["0"]}, {"Q": [2]}),
        "l1": _cell("LUT1", {"I0": [2]}, {"O": [3]}),
        "l2": _cell("LUT2", {"I0": [3], "I1": [2]}, {"O": [4]}),
        "c0": _cell("CARRY4", {"CI": ["0"], "CYINIT": ["0"], "DI": [4, 4, 4, 4], "S": [4, 4, 4, 4]},
                    {"O": [10, 11, 12, 13], "CO": [14, 15, 16, 17]}),
        "c1": _cell("CARRY4", {"CI": [17], "CYINIT": ["0"], "DI": ["0"] * 4, "S": ["1"] * 4},
                    {"O": [20, 21, 22, 23], "CO": [24, 25, 26, 27]}),
        "l3": _cell("LUT2", {"I0": [23], "I1": [2]}, {"O": [30]}),
        "l4": _cell("LUT1", {"I0": [40]}, {"O": [41]}),
    }
    module = {"ports": {"clk": {"direction": "input", "bits": [1]}, "a": {"direction": "input", "bits": [40]},
                        "y": {"direction": "output", "bits": [41]}},
              "cells": cells, "netnames": {"q": {"bits": [2]}, "d": {"bits": [30]}}}
    measured = module_arcs(module, set())
    arcs = {(a, b): n for a, b, n in measured["arcs"]}
    assert arcs[(SEQ, SEQ)] == 4           # LUT, LUT, the chain (one level), LUT
    assert arcs[("in:a", "out:y")] == 1
    assert measured["deepest"][0] == {"levels": 4, "from": "q", "to": "d"}
    assert measured["histogram"] == {4: 1}     # D; the clock is a port, CE and R constants
    assert measured["loop_breaks"] == 0


def test_compose_joins_arcs_along_the_hierarchy():
    # top: register -> 2 levels -> child input; child: input -> 3 levels -> output; top: child output -> 1 -> register
    arcs_of = {"top": {"arcs": [[SEQ, "cell:u:0", 2], ["cell:u:1", SEQ, 1], [SEQ, SEQ, 4]]},
               "child": {"arcs": [["in:0", "out:1", 3], [SEQ, SEQ, 5]]}}
    result = compose({"top": "top", "top/u": "child"}, arcs_of, {"top": {"u": "top/u"}, "top/u": {}})
    assert result["max_logic_levels"] == 6
    assert result["deepest"][0] == {"levels": 6, "through": ["top:<registers>", "top/u:0", "top/u:1",
                                                             "top:<register inputs>"]}
    assert result["deepest"][1] == {"levels": 5, "through": ["top/u:<registers>", "top/u:<register inputs>"]}
    assert result["port_loops"] == []


def test_a_small_design_synthesised_module_by_module(tmp_path: Path):
    modules = pair_modules()
    digests = netlist.module_digests(modules)
    yosys, version = netlist.yosys_command()
    jobs = netlist.jobs_for(modules, digests, tmp_path, yosys, version)
    assert len(jobs) == 3                                   # the two 8-bit adders synthesised once
    records = {digest: netlist.synthesise_unique(job) for digest, job in jobs.items()}
    assert netlist.jobs_for(modules, digests, tmp_path, yosys, version) == {}      # all cached now
    assert netlist.cached(tmp_path, digests["\\top.first"], version)["figures"] == records[digests["\\top.first"]][
        "figures"]
    narrow, wide = records[digests["\\top.first"]]["figures"], records[digests["\\top.wide"]]["figures"]
    # the wide adder's upper input bits are the parent's constant zeros, which Amaranth writes into the child
    # module: its sum of two 8-bit values needs 9 registers, not 16
    assert narrow["FF"] == 8 and wide["FF"] == 9 and records[digests["\\top"]]["figures"]["FF"] == 0
    own = {name: records[digests[name]]["figures"] for name in modules}
    assert netlist.totals(modules, own)["top"]["FF"] == 25
    # the top's arcs go from its input ports to both adders' inputs and from their outputs to the wide one's
    top_arcs = {(a, b) for a, b, _ in records[digests["\\top"]]["arcs"]}
    assert {p.split(":")[1] for a, b in top_arcs for p in (a, b) if p.startswith("cell:")} == {"first", "second", "wide"}
    # a damaged record is not used
    wide_digest = digests["\\top.wide"]
    path = tmp_path / f"{wide_digest}.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "digest": "0" * 16}))
    assert netlist.cached(tmp_path, wide_digest, version) is None


class Subtractor(wiring.Component):
    def __init__(self, width: int):
        super().__init__({"a": In(width), "b": In(width), "y": Out(width)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.y.eq(self.a - self.b)
        return m


class Crossed(wiring.Component):
    """Four 8-bit adders and two 16-bit subtractors of their sums: the subtractors' ports carry the global numbers
    of the narrow signals that drive them (`port$N$0`), different in each instance, so merging them must rename
    the connections by position, and a swap would change the result."""
    def __init__(self):
        super().__init__({"a": In(8), "b": In(8), "y": Out(32)})

    def elaborate(self, platform):
        m = Module()
        adders = [Adder(8) for _ in range(4)]
        for index, adder in enumerate(adders):
            m.submodules[f"adder{index}"] = adder
            m.d.comb += [adder.a.eq(self.a + index), adder.b.eq(self.b)]
        there, back = m.submodules.there, m.submodules.back = Subtractor(16), Subtractor(16)
        m.d.comb += [there.a.eq(adders[0].y), there.b.eq(adders[1].y), back.a.eq(adders[2].y),
                     back.b.eq(adders[3].y), self.y.eq(Cat(there.y, back.y))]
        return m


def test_deduplicate_keeps_one_module_per_digest_and_the_same_design(tmp_path: Path):
    text = rtlil.convert(Crossed(), name="top", emit_src=False)
    before = netlist.split_modules(text)
    assert before["\\top.there"].ports() != before["\\top.back"].ports()          # the case that needs renaming
    merged = netlist.deduplicate(text)
    after = netlist.split_modules(merged)
    assert set(after) == {"\\top", "\\top.adder0", "\\top.there"}
    assert after["\\top"].children == {**{f"\\adder{i}": "\\top.adder0" for i in range(4)},
                                       "\\there": "\\top.there", "\\back": "\\top.there"}
    # the merged design is the original one: Yosys proves the flattened pair equivalent
    (tmp_path / "gold.il").write_text(text)
    (tmp_path / "gate.il").write_text(merged)
    yosys, _ = netlist.yosys_command()
    script = ("read_rtlil gold.il; hierarchy -top top; proc; flatten; rename top gold; design -stash gold; "
              "read_rtlil gate.il; hierarchy -top top; proc; flatten; rename top gate; design -stash gate; "
              "design -copy-from gold -as gold gold; design -copy-from gate -as gate gate; "
              "equiv_make gold gate equiv; equiv_simple -seq 2; equiv_induct; equiv_status -assert")
    result = subprocess.run([*yosys, "-q", "-p", script], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_verilog_holds_each_distinct_module_once():
    text = verilog.convert(Crossed(), name="crossed")
    assert text.count("\nmodule ") + text.startswith("module ") == 3
    assert "module crossed(" in text


def test_one_buffer_alone_has_the_cores_ports(load_script):
    """synth_netlist.py --buffer: the buffer of the core's Buffers (hw/resource_estimates.core_buffers) as one
    design, its ports the units' (the vector unit's stepped operand lanes among them), nothing else."""
    from ringgpt.hw.config import get_config
    from ringgpt.hw.isa import Space
    from ringgpt.hw.resource_estimates import core_buffers
    modules = netlist.split_modules(load_script("synth_netlist").buffer_rtlil("sim-small", "ABUF"))
    ports = modules["\\top"].port_indices()
    buffers = core_buffers(get_config("sim-small"))
    mine = {name for name, (space, _) in buffers.ports.items() if space == Space.ABUF}
    assert {name.split("__")[0] for name in ports} - {"clk", "rst"} == mine
    assert "vector_abuf_src" in mine and "matrix_wbuf_tiles" not in mine
