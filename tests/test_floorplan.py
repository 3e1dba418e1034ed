"""hw/kernel/floorplan.py: interface widths from the signatures against hand counts, the exhaustive SLR assignment on
hand-made blocks (its optimum, an SLR0 -> SLR2 crossing counted per boundary, overflows reported), the netlist
report's figures, the Tcl's blocks and pblocks, and the link config's hook. Seconds: nothing is elaborated."""
from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.core.interfaces import RowWritePort
from ringgpt.hw.kernel import floorplan, vitis
from ringgpt.hw.kernel.floorplan import (BLOCK_PATHS, RESOURCES, Connection, FloorplanError, SlrCapacity, bits,
                                         connections, figures, place)

PLATFORM = vitis.platform(vitis.DEFAULT_PLATFORM)
SLRS = ("SLR0", "SLR1", "SLR2")


def lut(n: float) -> dict:
    return {key: n if key == "LUT" else 0 for key in RESOURCES}


def toy(luts: int = 100, slls: int = 1000) -> SlrCapacity:
    """Three SLRs of `luts` LUTs (and nothing else), `slls` per boundary."""
    return SlrCapacity(slrs=SLRS, resources={slr: lut(luts) for slr in SLRS}, slls=slls, hbm_slr="SLR0",
                       control_slr="SLR0", pblocks={slr: f"pb_{slr}" for slr in SLRS}, sources="test")


ENDS = {"hbm": "SLR0", "control": "SLR0", "ring": "SLR2"}


def test_a_row_write_port_has_its_hand_counted_bits():
    # first (32-bit word address) + data (2 rows x 4 words x 16 bits) + mask (8) + en + urgent + ready
    assert bits(RowWritePort(4)) == 32 + 2 * 4 * 16 + 8 + 1 + 1 + 1
    assert bits(RowWritePort(4, rows=1)) == 32 + 4 * 16 + 4 + 3


def test_connections_follow_the_signatures():
    cfg = get_config("sim-small", 2)
    links = {(c.a, c.b): c for c in connections(cfg)}
    assert links["control", "router"].bits == 2 + 3          # card_id in range(4), cards in range(5)
    dma = links["dma", "abuf"]
    assert set(dma.ports) == {"abuf_src", "abuf_dst", "engines_to_abuf"}
    ports = dict(floorplan._core(cfg).units["dma"].buffer_ports)
    assert dma.bits == sum(bits(ports[p][1]) for p in dma.ports)
    assert links["dma", "wbuf"].ports == ("wbuf_dst", "engines_to_wbuf")
    assert links["dma", "hbm"].ports == tuple(f"hbm{c:02d}" for c in range(cfg.hbm_channels))
    assert links["router", "ring"].ports == ("tx", "rx")
    assert links["router", "ring"].bits == 2 * (vitis.ring_width(cfg) + 3)   # tdata, tvalid, tready, tlast
    assert ("router", "ring") not in {(c.a, c.b) for c in connections(get_config("sim-small", 1))}
    assert {block for c in links.values() for block in (c.a, c.b)} == {*BLOCK_PATHS, "hbm", "host", "ring", "control"}


def test_the_search_finds_the_hand_worked_optimum():
    # a must sit by HBM; a and b do not fit one SLR; c and d (tightly linked) fit beside neither a nor b
    links = [Connection("hbm", "a", 500, ()), Connection("a", "b", 100, ()), Connection("b", "c", 10, ()),
             Connection("c", "d", 400, ())]
    blocks = {"a": lut(60), "b": lut(60), "c": lut(30), "d": lut(30)}
    plan = place(links, blocks, lut(0), ENDS, toy(), ceiling=1.0)
    assert plan.fits and plan.assignment == {"a": "SLR0", "b": "SLR1", "c": "SLR2", "d": "SLR2"}
    assert plan.sll == {"SLR0-SLR1": 100, "SLR1-SLR2": 10}
    assert plan.loads["SLR2"]["LUT"] == 60 and plan.limits["SLR1"]["LUT"] == 100


def test_a_crossing_from_slr0_to_slr2_uses_both_boundaries():
    links = [Connection("hbm", "x", 7, ()), Connection("x", "ring", 100, ())]
    plan = place(links, {"x": lut(1)}, lut(0), ENDS, toy(), ceiling=1.0)
    assert plan.assignment == {"x": "SLR2"}
    assert plan.sll == {"SLR0-SLR1": 7, "SLR1-SLR2": 7}
    assert [(c.bits, hops) for c, hops in plan.crossing] == [(7, 2)]
    assert plan.to_dict()["crossing_bits"] == 7


def test_overflows_are_reported_not_raised():
    plan = place([], {"big": lut(150), "small": lut(10)}, lut(0), ENDS, toy(), ceiling=1.0)
    assert not plan.fits
    assert plan.problems == (f"{plan.assignment['big']} LUT 150 > 100 by 50 (big)",)
    assert "does NOT fit" in plan.summary() and "\n" not in plan.summary()
    # two blocks that fit only apart, joined by more wires than a boundary has: the lesser overflow is kept
    plan = place([Connection("p", "q", 1100, ())], {"p": lut(60), "q": lut(60)}, lut(0), ENDS, toy(), ceiling=1.0)
    assert plan.problems == ("SLR0-SLR1 SLLs 1,100 > 1,000 by 100",)
    plan = place([Connection("p", "q", 1300, ())], {"p": lut(60), "q": lut(60)}, lut(0), ENDS, toy(), ceiling=1.0)
    assert plan.problems == ("SLR0 LUT 120 > 100 by 20 (p, q)",)
    # the ceiling counts: 80 LUTs fit a 100-LUT SLR whole, not at 70 %
    assert place([], {"b": lut(80)}, lut(0), ENDS, toy(), ceiling=1.0).fits
    assert not place([], {"b": lut(80)}, lut(0), ENDS, toy(), ceiling=0.7).fits


def test_the_fixed_load_sits_at_the_control_end():
    plan = place([], {"a": lut(60)}, lut(50), ENDS, toy(), ceiling=1.0)
    assert plan.assignment == {"a": "SLR1"} and plan.loads["SLR0"]["LUT"] == 50


def report(units: dict | None = None) -> dict:
    """A netlist report in scripts/synth_netlist.py's format, every figure hand-made."""
    row = {key: 10 for key in (*RESOURCES, "MUXF7", "MUXF8", "CARRY8")}
    parts = {"buffers/abuf": {**row, "LUT": 100}, "buffers/wbuf": {**row, "LUT": 200}, "matrix/core": row}
    base = {name: row for name in ("controller", "fetch", "dma", "matrix", "vector", "router")}
    return {"units": {**base, "buffers": {**row, "LUT": 307}, "kernel and core wiring": {**row, "LUT": 5},
                      **(units or {})}, "parts": parts}


def test_figures_come_from_units_and_buffer_parts():
    blocks, fixed = figures(report(), "r.json")
    assert set(blocks) == set(BLOCK_PATHS)
    assert blocks["abuf"]["LUT"] == 100 and blocks["wbuf"]["LUT"] == 200 and blocks["dma"]["LUT"] == 10
    assert fixed["LUT"] == 5 + 307 - 100 - 200                # the wiring and the buffers' own cells
    broken = report()
    del broken["parts"]["buffers/wbuf"]
    with pytest.raises(FloorplanError, match="r.json has no figures for 'buffers/wbuf'"):
        figures(broken, "r.json")


def sim_small_plan(cards: int = 2):
    cfg = get_config("sim-small", cards)
    return cfg, floorplan.plan(cfg, PLATFORM, report(), "r.json")


def test_the_tcl_places_every_block_in_an_existing_pblock():
    cfg, plan = sim_small_plan()
    assert plan.fits
    tcl = floorplan.floorplan_tcl(cfg, PLATFORM, plan)
    placed = re.findall(r"^add_cells_to_pblock \[ringgpt_pblock (\S+)\] \[ringgpt_block (\S+)\] -clear_locs$", tcl,
                        re.M)
    pblocks = floorplan.capacity(PLATFORM).pblocks
    assert sorted(path for _, path in placed) == sorted(BLOCK_PATHS.values())
    assert dict((path, pblock) for pblock, path in placed) == \
        {BLOCK_PATHS[block]: pblocks[slr] for block, slr in plan.assignment.items()}
    assert "ringgpt_kernel_1/core/$path" in tcl and "NUM_TOP_SLLS [get_slrs SLR1]" in tcl
    assert tcl.count("{") == tcl.count("}")


def test_the_link_config_runs_the_floorplan_before_opt_design():
    cfg = get_config("sim-small", 2)
    link = vitis.link_config(cfg, PLATFORM, "/abs/floorplan.tcl")
    assert link.splitlines()[-1] == "prop=run.impl_1.STEPS.OPT_DESIGN.TCL.PRE=/abs/floorplan.tcl"
    assert link.index("[vivado]") > link.index("[connectivity]")
    assert "[vivado]" not in vitis.link_config(cfg, PLATFORM)


def test_u280_capacities_are_thirds_of_the_device():
    slrs = floorplan.capacity(PLATFORM)
    assert sum(slrs.resources[slr]["URAM"] for slr in slrs.slrs) == 960
    assert slrs.hbm_slr == "SLR0" and PLATFORM.link_slr == "SLR2" and "NOT sourced" in slrs.sources


def test_command_line_says_when_it_cannot_check(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert floorplan.main(["--config", "sim-small", "--netlist", str(tmp_path / "none.json")]) == 0
    assert out.getvalue().splitlines()[-1].startswith("floorplan not checked:")
    assert "python scripts/synth_netlist.py --config sim-small" in out.getvalue()
    (tmp_path / "bad.json").write_text("{not json")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert floorplan.main(["--config", "sim-small", "--netlist", str(tmp_path / "bad.json")]) == 2
    assert err.getvalue().count("\n") == 1 and "cannot read the netlist report" in err.getvalue()
    (tmp_path / "ok.json").write_text(json.dumps(report()))
    with contextlib.redirect_stdout(out):
        assert floorplan.main(["--config", "sim-small", "--cards", "2", "--netlist", str(tmp_path / "ok.json")]) == 0
    assert out.getvalue().splitlines()[-1].startswith("floorplan: fits.")
