"""scripts/build_bitstream.py and hw/kernel/vitis.py: the kernel's Verilog, lint, kernel.xml, Tcl and link config at
sim-small, checked against registers.py and against each other; the stop without Xilinx tools; the manifest; the
refusal of folders that are not the build's; and the Vivado / v++ steps with stand-in executables that record their
arguments. One real build (Verilog + lint, about a minute) is shared by the tests that read its files; the tests of
the folder handling and of the Xilinx steps build with a stand-in for the kernel's Verilog and skip the lint."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import io
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ringgpt.hw.config import ConfigError, get_config
from ringgpt.hw.kernel import floorplan, registers, vitis
from ringgpt.hw.kernel.registers import master_ports, register_map
from ringgpt.sim.cocotb_support.runner import verilator_bin

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("build_bitstream", ROOT / "scripts" / "build_bitstream.py")
build_bitstream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_bitstream)

CFG = get_config("sim-small", 2)
PLATFORM = vitis.platform(vitis.DEFAULT_PLATFORM)
MANIFEST_FIELDS = {"kernel", "config", "config_hash", "cards", "config_dict", "register_map_hash", "git_commit",
                   "tools", "resources", "floorplan", "platform", "xclbin", "steps"}


def path_without_xilinx_tools() -> str:
    """PATH less every folder holding vivado or v++."""
    return os.pathsep.join(folder for folder in os.environ["PATH"].split(os.pathsep)
                           if not any((Path(folder) / tool).exists() for tool in build_bitstream.XILINX_TOOLS))


def build(*args: str) -> tuple[int, str]:
    """Runs the script at sim-small on 2 cards with `args`; (exit code, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = build_bitstream.main(["--config", "sim-small", "--cards", "2", "--skip-synth", *args])
    return code, err.getvalue()


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture
def stand_in_verilog(monkeypatch):
    """KernelTop.verilog replaced by a one-line module (for the tests that do not read the Verilog)."""
    text = "module ringgpt_kernel(); endmodule\n"
    monkeypatch.setattr(build_bitstream.KernelTop, "verilog", lambda cfg: text)
    return text


@pytest.fixture(scope="module")
def no_tools(tmp_path_factory):
    """A whole build (Verilog and lint) on a machine without Vivado and v++: (out, exit code, stderr)."""
    out = tmp_path_factory.mktemp("bitstream") / "sim-small-x2"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path_without_xilinx_tools())
        code, err = build("--out", str(out))
    return out, code, err


def test_stops_before_the_xilinx_tools_with_exit_code_2(no_tools):
    out, code, err = no_tools
    assert code == 2
    message = err.strip()
    assert "\n" not in message
    assert "vivado and v++ not on PATH" in message and f"Vitis {PLATFORM.vitis}" in message
    assert f"source /tools/Xilinx/Vitis/{PLATFORM.vitis}/settings64.sh" in message
    steps = manifest(out)["steps"]
    assert steps == {"verilog": "done", "lint": "done", "resources": "skipped: --skip-synth", "vitis_sources": "done",
                     "package_xo": "skipped: vivado and v++ not on PATH", "link": "skipped: vivado and v++ not on PATH"}
    written = {p.name for p in out.iterdir()}
    assert written == {"manifest.json", "ringgpt_kernel.v", "work", *vitis.KERNEL_FILES, *vitis.AURORA_FILES}


def test_verilog_is_lint_clean(no_tools):
    out, _, _ = no_tools
    log = (out / vitis.WORK / "lint.log").read_text()
    assert "%Warning" not in log and "%Error" not in log
    tools = manifest(out)["tools"]
    assert tools["verilator"] and tools["vivado"] is None and tools["v++"] is None


def top_ports(verilog: str) -> dict[str, tuple[str, int]]:
    """{port: (direction, width)} of module ringgpt_kernel."""
    top = verilog[verilog.index("module ringgpt_kernel("):]
    top = top[:top.index("endmodule")]
    return {name: (direction, int(msb) + 1 if msb else 1) for direction, msb, name in
            re.findall(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+);", top, re.M)}


def test_kernel_xml_matches_the_register_map(no_tools):
    out, _, _ = no_tools
    kernel = ET.parse(out / vitis.KERNEL_XML).getroot().find("kernel")
    assert kernel.get("name") == "ringgpt_kernel" and kernel.get("hwControlProtocol") == "ap_ctrl_hs"
    args = kernel.find("args").findall("arg")
    arguments = [reg for reg in register_map(CFG) if reg.kind != "status"]
    assert [int(arg.get("id")) for arg in args] == list(range(len(arguments) + 2))
    for arg, reg in zip(args[:len(arguments)], arguments, strict=True):
        assert arg.get("name") == reg.name
        assert int(arg.get("offset"), 16) == reg.offset and int(arg.get("size"), 16) == reg.bits // 8
        assert int(arg.get("addressQualifier")) == (1 if reg.kind == "pointer" else 0)
        assert arg.get("port") == (f"m_axi_{reg.port}" if reg.kind == "pointer" else "s_axi_control")
    assert [(a.get("name"), a.get("addressQualifier")) for a in args[len(arguments):]] == [("ring_tx", "4"),
                                                                                            ("ring_rx", "4")]
    control = kernel.find("ports").find("port[@name='s_axi_control']")
    assert int(control.get("range"), 16) == 1 << registers.ADDRESS_BITS


def test_ports_agree_across_verilog_kernel_xml_and_link_config(no_tools):
    out, _, _ = no_tools
    ports = top_ports((out / "ringgpt_kernel.v").read_text())
    masters = {name.removeprefix("m_axi_").rsplit("_", 1)[0] for name in ports if name.startswith("m_axi_")}
    assert masters == set(master_ports(CFG))
    xml_ports = {p.get("name"): p for p in ET.parse(out / vitis.KERNEL_XML).getroot().iter("port")}
    link = (out / vitis.LINK_CFG).read_text()
    sp = dict(re.findall(r"^sp=ringgpt_kernel_1\.m_axi_(\w+):(HBM\[\d+\])$", link, re.M))
    assert set(sp) == masters
    for port in masters:
        assert xml_ports[f"m_axi_{port}"].get("mode") == "master"
        assert int(xml_ports[f"m_axi_{port}"].get("dataWidth")) == ports[f"m_axi_{port}_rdata"][1]
        assert ports[f"m_axi_{port}_araddr"] == ("output", 64)
    assert {sp[f"hbm{c:02d}"] for c in range(CFG.hbm_channels)} == {f"HBM[{c}]" for c in range(CFG.hbm_channels)}
    assert ports["s_axi_control_awaddr"] == ("input", registers.ADDRESS_BITS)
    width = ports["ring_tx_tdata"][1]
    assert ports["ring_rx_tdata"] == ("input", width)
    assert (xml_ports["ring_tx"].get("mode"), int(xml_ports["ring_tx"].get("dataWidth"))) == ("write_only", width)
    assert (xml_ports["ring_rx"].get("mode"), int(xml_ports["ring_rx"].get("dataWidth"))) == ("read_only", width)
    aurora = {p.get("name"): p for p in ET.parse(out / vitis.AURORA_XML).getroot().iter("port")}
    assert {name: int(p.get("dataWidth")) for name, p in aurora.items()} == {"tx_axis": width, "rx_axis": width}
    assert "stream_connect=ringgpt_kernel_1.ring_tx:ringgpt_aurora_1.tx_axis" in link
    assert "stream_connect=ringgpt_aurora_1.rx_axis:ringgpt_kernel_1.ring_rx" in link


def test_manifest_names_the_config_and_the_register_map(no_tools):
    out, _, _ = no_tools
    found = manifest(out)
    assert set(found) == MANIFEST_FIELDS
    assert (found["kernel"], found["config"], found["cards"]) == ("ringgpt_kernel", "sim-small", 2)
    assert found["config_hash"] == CFG.hash and found["config_dict"] == CFG.to_dict()
    assert found["register_map_hash"] == registers.map_hash(CFG)
    assert found["platform"] == PLATFORM.name and found["xclbin"] is None and found["resources"] is None
    assert found["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", found["git_commit"])


def test_one_card_closes_the_ring_on_chip():
    link = vitis.link_config(get_config("sim-small", 1), PLATFORM)
    assert "stream_connect=ringgpt_kernel_1.ring_tx:ringgpt_kernel_1.ring_rx" in link
    assert "ringgpt_aurora" not in link
    assert set(vitis.vitis_files(get_config("sim-small", 1), PLATFORM)) == set(vitis.KERNEL_FILES)


def test_u280_uses_every_hbm_pseudo_channel():
    cfg = get_config("u280", 4)
    banks = vitis.memory_banks(cfg, PLATFORM)
    assert [banks[f"hbm{c:02d}"] for c in range(32)] == [f"HBM[{c}]" for c in range(32)]
    assert (banks["prog"], banks["host"]) == ("HBM[31]", "HBM[30]")
    args = ET.fromstring(vitis.kernel_xml(cfg)).find("kernel").find("args")
    assert [a.get("name") for a in args if a.get("addressQualifier") == "1"] == \
        ["program", "host", *(f"hbm{c:02d}" for c in range(32))]
    with pytest.raises(ConfigError, match="HBM channels"):
        vitis.memory_banks(dataclasses.replace(cfg, hbm_channels=64, hbm_channel_mbytes=64), PLATFORM)


# --- the Aurora kernel's Verilog, linted against stand-ins with the Xilinx IP's ports --------------------------------

def _stub(module: str, ports: list[str]) -> str:
    return f"module {module} (" + ", ".join(ports) + "); endmodule\n"


def ip_stubs(ring_bits: int) -> str:
    """Port-for-port stand-ins of the Xilinx IP ringgpt_aurora instantiates (Aurora 64B/66B v12.0 framing with
    immediate NFC, axis_data_fifo 2.0, axis_dwidth_converter 1.1, XPM CDC)."""
    aurora = ["input wire [0:3] rxp", "input wire [0:3] rxn", "output wire [0:3] txp", "output wire [0:3] txn",
              "input wire gt_refclk1_p", "input wire gt_refclk1_n", "input wire init_clk", "input wire reset_pb",
              "input wire pma_init", "input wire power_down", "input wire [2:0] loopback",
              "input wire gt_rxcdrovrden_in", "output wire user_clk_out", "output wire sync_clk_out",
              "output wire tx_out_clk", "output wire gt_refclk1_out",
              "input wire [0:255] s_axi_tx_tdata", "input wire [0:31] s_axi_tx_tkeep", "input wire s_axi_tx_tlast",
              "input wire s_axi_tx_tvalid", "output wire s_axi_tx_tready", "output wire [0:255] m_axi_rx_tdata",
              "output wire [0:31] m_axi_rx_tkeep", "output wire m_axi_rx_tlast", "output wire m_axi_rx_tvalid",
              "input wire s_axi_nfc_tvalid", "input wire [0:15] s_axi_nfc_tdata", "output wire s_axi_nfc_tready",
              "output wire channel_up", "output wire [0:3] lane_up", "output wire hard_err", "output wire soft_err",
              "output wire gt_pll_lock", "output wire mmcm_not_locked_out", "output wire [3:0] gt_powergood",
              "output wire link_reset_out", "output wire sys_reset_out", "output wire gt_reset_out",
              "output wire gt_qpllclk_quad1_out", "output wire gt_qpllrefclk_quad1_out",
              "output wire gt_qpllrefclklost_quad1_out", "output wire gt_qplllock_quad1_out"]
    for lane in range(vitis.AURORA_LANES):
        aurora += [f"input wire [9:0] gt{lane}_drpaddr", f"input wire [15:0] gt{lane}_drpdi",
                   f"input wire gt{lane}_drpwe", f"input wire gt{lane}_drpen", f"output wire gt{lane}_drprdy",
                   f"output wire [15:0] gt{lane}_drpdo"]

    def stream(side: str, direction: str, bits: int) -> list[str]:
        back = "output" if direction == "input" else "input"
        return [f"{direction} wire [{bits - 1}:0] {side}_tdata", f"{direction} wire {side}_tlast",
                f"{direction} wire {side}_tvalid", f"{back} wire {side}_tready"]
    fifo = ["input wire s_axis_aresetn", "input wire s_axis_aclk", "input wire m_axis_aclk",
            *stream("s_axis", "input", ring_bits), *stream("m_axis", "output", ring_bits)]
    width = ["input wire aclk", "input wire aresetn"]
    text = _stub("xpm_cdc_async_rst", ["input wire src_arst", "input wire dest_clk", "output wire dest_arst"])
    text += _stub("xpm_cdc_single", ["input wire src_clk", "input wire src_in", "input wire dest_clk",
                                     "output wire dest_out"])
    text += _stub("ringgpt_aurora_qsfp0", aurora) + _stub("ringgpt_aurora_qsfp1", aurora)
    text += _stub("ringgpt_aurora_tx_fifo", fifo)
    text += _stub("ringgpt_aurora_rx_fifo", fifo + ["output wire prog_full", "output wire prog_empty"])
    text += _stub("ringgpt_aurora_tx_width", width + stream("s_axis", "input", ring_bits) +
                  stream("m_axis", "output", vitis.AURORA_BITS))
    text += _stub("ringgpt_aurora_rx_width", width + stream("s_axis", "input", vitis.AURORA_BITS) +
                  stream("m_axis", "output", ring_bits))
    return text


@pytest.mark.parametrize("preset", ["sim-small", "u280"])  # a ring narrower than Aurora's beats, and a wider one
def test_aurora_kernel_lints_against_the_ip_ports(preset, tmp_path):
    cfg = get_config(preset, 2)
    (tmp_path / vitis.AURORA_VERILOG).write_text(vitis.aurora_verilog(cfg))
    (tmp_path / "ip.v").write_text(ip_stubs(vitis.ring_width(cfg)))
    env = {**os.environ, "PATH": f"{verilator_bin()}{os.pathsep}{os.environ['PATH']}"}
    waivers = [f"-Wno-{warning}" for warning in build_bitstream.LINT_WAIVERS]
    result = subprocess.run(["verilator", "--lint-only", "--top-module", "ringgpt_aurora", *waivers,
                             vitis.AURORA_VERILOG, "ip.v"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    tcl = vitis.package_aurora_tcl(cfg, PLATFORM)
    assert ("ringgpt_aurora_tx_width" in tcl) == (vitis.ring_width(cfg) > vitis.AURORA_BITS)


# --- the build folder ---------------------------------------------------------------------------------------------

def test_refuses_a_folder_that_is_not_the_builds(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    code, err = build("--out", str(out))
    assert code == 2 and "--force" in err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("planted", ["manifest.json", "kernel.xml"])
def test_never_replaces_a_file_it_did_not_write_even_with_force(planted, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / planted).write_text('{"something": "else"}')
    code, err = build("--out", str(out), "--force")
    assert code == 2 and "even with --force" in err
    assert (out / planted).read_text() == '{"something": "else"}' and len(list(out.iterdir())) == 1


def test_force_adds_the_builds_files_beside_others(stand_in_verilog, tmp_path, monkeypatch):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    monkeypatch.setenv("PATH", path_without_xilinx_tools())
    code, _ = build("--out", str(out), "--force", "--skip-lint")
    assert code == 2 and (out / "notes.txt").read_text() == "keep me"
    assert manifest(out)["steps"]["vitis_sources"] == "done"
    assert (out / "ringgpt_kernel.v").read_text() == stand_in_verilog


def test_without_a_netlist_report_the_floorplan_is_not_checked(stand_in_verilog, tmp_path, monkeypatch):
    out, absent = tmp_path / "built", tmp_path / "absent.json"
    monkeypatch.setenv("PATH", path_without_xilinx_tools())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        code = build_bitstream.main(["--config", "sim-small", "--cards", "2", "--skip-synth", "--skip-lint",
                                     "--out", str(out), "--netlist", str(absent)])
    assert code == 2
    lines = [line for line in printed.getvalue().splitlines() if "floorplan" in line]
    assert len(lines) == 1 and "floorplan not checked" in lines[0]
    assert "python scripts/synth_netlist.py --config sim-small" in lines[0]
    assert manifest(out)["floorplan"]["checked"] is False
    assert not (out / floorplan.FLOORPLAN_TCL).exists() and "[vivado]" not in (out / vitis.LINK_CFG).read_text()


# --- Vivado and v++, stood in for by scripts that record their arguments ----------------------------------------------

FAKE_VIVADO = """#!/bin/sh
echo "vivado|$PWD|$*" >> "$FAKE_TOOLS_LOG"
[ "$1" = "-version" ] && { echo "vivado v2022.2 (64-bit)"; exit 0; }
[ -n "$FAKE_VIVADO_FAILS" ] && exit 3
while [ $# -gt 0 ]; do [ "$1" = "-source" ] && tcl="$2"; shift; done
case "$tcl" in *package_kernel.tcl) : > ringgpt_kernel.xo ;; *package_aurora.tcl) : > ringgpt_aurora.xo ;; esac
"""
FAKE_VPP = """#!/bin/sh
echo "v++|$PWD|$*" >> "$FAKE_TOOLS_LOG"
[ "$1" = "--version" ] && { echo "****** v++ v2022.2 (64-bit)"; exit 0; }
while [ $# -gt 0 ]; do [ "$1" = "--output" ] && out="$2"; shift; done
printf 'xclbin2 for the test' > "$out"
"""


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """vivado and v++ stand-ins first on PATH; returns the file their calls are recorded in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("vivado", FAKE_VIVADO), ("v++", FAKE_VPP)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_TOOLS_LOG", str(log))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{path_without_xilinx_tools()}")
    return log


def test_runs_vivado_then_v_plus_plus_and_records_the_xclbin(stand_in_verilog, fake_tools, tmp_path):
    out = tmp_path / "built"
    code, err = build("--out", str(out), "--skip-lint")
    assert code == 0, err
    xclbin = f"ringgpt-{CFG.name}.xclbin"
    calls = [line.split("|") for line in fake_tools.read_text().splitlines()]
    assert [(tool, args) for tool, _, args in calls[:2]] == [("vivado", "-version"), ("v++", "--version")]
    work = str((out / vitis.WORK).resolve())
    packaging = [("vivado", work, f"-mode batch -notrace -nojournal -log {Path(tcl).stem}.log -source ../{tcl}")
                 for tcl in vitis.packaging_scripts(CFG)]
    link = ("v++", work, " ".join(vitis.link_command(CFG, PLATFORM, xclbin)[1:]))
    assert [tuple(call) for call in calls[2:]] == [*packaging, link]
    found = manifest(out)
    assert found["xclbin"] == {"path": xclbin, "sha256": hashlib.sha256(b"xclbin2 for the test").hexdigest()}
    assert (out / xclbin).read_bytes() == b"xclbin2 for the test"
    assert found["steps"]["package_xo"] == found["steps"]["link"] == "done"
    assert found["tools"]["vivado"] == "vivado v2022.2 (64-bit)" and found["tools"]["v++"] == "v++ v2022.2 (64-bit)"


def test_the_floorplan_tcl_is_written_and_linked(stand_in_verilog, fake_tools, tmp_path):
    out, netlist = tmp_path / "built", tmp_path / "netlist.json"
    row = {"LUT": 100, "FF": 100, "DSP": 1, "BRAM36": 1, "URAM": 1}
    netlist.write_text(json.dumps({"units": {name: row for name in ("controller", "fetch", "dma", "matrix", "vector",
                                                                    "router", "buffers", "kernel and core wiring")},
                                   "parts": {"buffers/abuf": row, "buffers/wbuf": row}}))
    code, err = build("--out", str(out), "--skip-lint", "--netlist", str(netlist))
    assert code == 0, err
    tcl = out / floorplan.FLOORPLAN_TCL
    link = (out / vitis.LINK_CFG).read_text()
    assert f"prop=run.impl_1.STEPS.OPT_DESIGN.TCL.PRE={tcl.resolve()}" in link.splitlines()
    record = manifest(out)["floorplan"]
    assert record["checked"] and record["fits"] and record["tcl"] == tcl.name
    assert set(record["assignment"]) == set(floorplan.BLOCK_PATHS) and set(record["sll"]) == {"SLR0-SLR1",
                                                                                              "SLR1-SLR2"}
    assert all(f"[ringgpt_block {path}]" in tcl.read_text() for path in floorplan.BLOCK_PATHS.values())
    netlist.write_text(json.dumps({"units": {}, "parts": {}}))     # a report without the blocks: stops, says why
    code, err = build("--out", str(out), "--skip-lint", "--netlist", str(netlist))
    assert code == 2 and "has no figures for 'controller'" in err and err.count("\n") == 1
    assert manifest(out)["steps"]["vitis_sources"].startswith("failed:") and not tcl.exists()


def test_a_failing_tool_stops_the_build_and_a_rebuild_replaces_it(stand_in_verilog, fake_tools, tmp_path,
                                                                   monkeypatch):
    out = tmp_path / "built"
    monkeypatch.setenv("FAKE_VIVADO_FAILS", "1")
    code, err = build("--out", str(out), "--skip-lint")
    assert code == 1 and "vivado exited with 3" in err
    steps = manifest(out)["steps"]
    assert steps["package_xo"].startswith("failed: vivado exited with 3")
    assert steps["link"] == "skipped: package_xo failed"
    assert manifest(out)["xclbin"] is None
    monkeypatch.delenv("FAKE_VIVADO_FAILS")
    assert build("--out", str(out), "--skip-lint")[0] == 0  # the folder is the build's own: built again in place
    assert manifest(out)["steps"]["link"] == "done"


# --- the resource estimates (Yosys on every part of the core at sim-small: minutes) -----------------------------------

@pytest.mark.slow
def test_resource_estimates_say_they_are_per_unit(tmp_path):
    resources = build_bitstream.resource_estimates(get_config("sim-small"), tmp_path)
    assert "not a synthesis of the whole kernel" in resources["method"]
    assert resources["units"]["total"]["LUT"] > 0 and set(resources["percent_of_limits"]) == set(resources["limits"])
