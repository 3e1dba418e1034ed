"""What Vitis needs to turn the kernel's Verilog into an Alveo U280 `.xclbin`, generated from registers.py and the
config (scripts/build_bitstream.py writes these files and runs the tools):

    kernel.xml            the RTL kernel's description: s_axi_control, every m_axi port, the ring streams, and
                          every argument at its registers.py offset (XRT, PYNQ and v++ read it from the .xo)
    package_kernel.tcl    Vivado: packages ringgpt_kernel.v as an IP (clock, active-low reset, interrupt, the
                          register map) and calls package_xo -> work/ringgpt_kernel.xo
    link.cfg              v++ --link: one compute unit per card, each m_axi port's HBM pseudo-channel, the ring,
                          and the floorplan Tcl before placement when the build has one (hw/kernel/floorplan.py)
    ringgpt_aurora.v,     (rings of 2+ cards) the ring's QSFP28 links: an RTL kernel around two Aurora 64B/66B cores,
    ringgpt_aurora.xml,   its description, clocks and the Vivado Tcl that generates the Xilinx IP it instantiates
    ringgpt_aurora.xdc,   and packages it -> work/ringgpt_aurora.xo
    package_aurora.tcl

The ring (docs/architecture.md): card i sends to card i + 1. Each card's `ringgpt_aurora` sends the kernel's
`ring_tx` beats out of QSFP0 and hands the beats arriving on QSFP1 to `ring_rx`, so cables run from card i's QSFP0
to card (i + 1) % n's QSFP1; a link's other direction carries only the receiver's flow control (Aurora native flow
control: XOFF when its receive FIFO is half full). A one-card build closes the ring on chip (ring_tx -> ring_rx,
no Aurora, no cable). Aurora cores: 4 lanes x 25.78125 Gb/s from the 161.1328125 MHz QSFP reference clock, framing
(tlast travels), as Xilinx's "Using Aurora IP in Alveo with Vitis Flow" tutorial and AuroraFlow (tested at 100 Gb/s
on the U280) configure them; the 256-bit Aurora user interface runs on its own user_clk (402.8 MHz), reached from
ap_clk through asynchronous AXI4-Stream FIFOs; rings wider than 256 bits are split into 256-bit beats at user_clk
(axis_dwidth_converter), narrower ones travel in the low bits of one beat each.

Memory: port hbmNN's buffer lives in HBM pseudo-channel NN (sp=...m_axi_hbmNN:HBM[NN]). The program and the host
buffer move kilobytes per token against the megabytes of weights every channel streams, so they take the two
highest pseudo-channels (memory_banks): free ones when the config uses fewer than 31 channels, else shared with
hbm30 / hbm31 (u280 uses all 32). The host allocates each buffer in its port's bank.
"""
from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from amaranth.hdl import Shape

from ringgpt.hw.config import ArchConfig, ConfigError

from .kernel import KERNEL_MODULE, KernelTop
from .registers import ADDRESS_BITS, CONTROL, DATA_BITS, GIE, IER, ISR, hbm_port, master_ports, register_map

AURORA_MODULE = "ringgpt_aurora"
VENDOR, LIBRARY, VERSION = "ringgpt", "kernel", "1.0"
"""The packaged IPs' VLNV: <VENDOR>:<LIBRARY>:<module>:<VERSION> (kernel.xml names it)."""
WORK = "work"
"""Subfolder of a build for the tools' projects, IPs, .xo files, logs and reports."""
KERNEL_FILES = KERNEL_XML, KERNEL_TCL, LINK_CFG = "kernel.xml", "package_kernel.tcl", "link.cfg"
AURORA_FILES = AURORA_VERILOG, AURORA_XML, AURORA_XDC, AURORA_TCL = \
    "ringgpt_aurora.v", "ringgpt_aurora.xml", "ringgpt_aurora.xdc", "package_aurora.tcl"
"""The files vitis_files writes: always, and for rings of 2+ cards."""

AURORA_LANES, AURORA_LINE_GBPS, AURORA_REFCLK_MHZ, AURORA_INIT_CLK_MHZ = 4, 25.78125, 161.1328125, 100
AURORA_BITS = 64 * AURORA_LANES
"""Width of an Aurora 64B/66B core's user interface: 64 bits per lane per user_clk cycle."""
AURORA_IP = {"aurora_64b66b": "12.0", "axis_data_fifo": "2.0", "axis_dwidth_converter": "1.1"}
"""Xilinx IP (Vivado 2022.2 catalog versions) the Aurora kernel instantiates."""
LINK_RX_FIFO_BYTES = 65536
"""Receive FIFO per link: XOFF at half full leaves 32 KiB for the beats in flight after the pause request, 2.6 us at
100 Gb/s, above the link's round trip (AuroraFlow sizes its U280 FIFO the same)."""
LINK_TX_FIFO_BEATS = 32
"""Transmit FIFO per link (only the clock crossing)."""
NFC_XOFF, NFC_XON = 0xFFFF, 0x0000
"""Immediate native flow control words: pause until XON, resume."""
RESET_COUNTER_BITS = 27
"""The Aurora cores' reset sequence lasts 2**27 init_clk cycles (1.3 s at 100 MHz), as Xilinx's tutorial's."""


@dataclass(frozen=True)
class Platform:
    """A Vitis platform the build knows: its part, HBM, SLRs and QSFP28 interfaces (platforminfo --verbose)."""
    name: str
    part: str
    vitis: str
    """The Vitis release that ships this platform's tools (vivado, v++)."""
    hbm_banks: int
    hbm_bank_mbytes: int
    link_slr: str
    """The SLR of the QSFP28 transceivers."""
    qsfp: tuple[tuple[str, str], ...]
    """(GT interface, 161.1328125 MHz reference clock) of each QSFP28 cage, QSFP0 first."""
    free_running_clock: str
    """A 100 MHz clock that runs from power-up (the Aurora cores' init_clk)."""


DEFAULT_PLATFORM = "xilinx_u280_gen3x16_xdma_1_202211_1"
PLATFORMS = {p.name: p for p in (
    Platform(name=DEFAULT_PLATFORM, part="xcu280-fsvh2892-2L-e", vitis="2022.2",
             hbm_banks=32, hbm_bank_mbytes=256, link_slr="SLR2",
             qsfp=(("io_gt_qsfp0_00", "io_clk_qsfp0_refclkb_00"), ("io_gt_qsfp1_00", "io_clk_qsfp1_refclkb_00")),
             free_running_clock="ii_level0_wire/ulp_m_aclk_freerun_ref_00"),
)}


def platform(name: str) -> Platform:
    if name not in PLATFORMS:
        raise ConfigError(f"unknown Vitis platform {name!r}: the build knows {', '.join(sorted(PLATFORMS))} (its HBM, "
                          "SLRs and QSFP28 interfaces are in ringgpt.hw.kernel.vitis.PLATFORMS)")
    return PLATFORMS[name]


# --- the kernel's ports, read from its signature ---------------------------------------------------------------------

def _width(cfg: ArchConfig, port: str) -> int:
    return Shape.cast(_signature(cfg).members[port].shape).width


@functools.cache
def _signature(cfg: ArchConfig):
    return KernelTop.signature_of(cfg)


def master_width(cfg: ArchConfig, port: str) -> int:
    """Data width of AXI4 master `m_axi_<port>`."""
    return _width(cfg, f"m_axi_{port}_rdata")


def ring_width(cfg: ArchConfig) -> int:
    """Data width of the ring streams (ring_tx, ring_rx)."""
    return _width(cfg, "ring_tx_tdata")


def instance(kernel: str) -> str:
    """The compute unit's name: one per card (each card is its own device)."""
    return f"{kernel}_1"


def memory_banks(cfg: ArchConfig, target: Platform) -> dict[str, str]:
    """The memory each m_axi port of the kernel reaches: {port: 'HBM[n]'} (see the module docstring)."""
    banks, size = target.hbm_banks, target.hbm_bank_mbytes
    if cfg.hbm_channels > banks:
        raise ConfigError(f"config {cfg.name!r} has {cfg.hbm_channels} HBM channels but {target.name} has {banks} "
                          "pseudo-channels")
    if cfg.hbm_channel_mbytes > size:
        raise ConfigError(f"config {cfg.name!r} gives each HBM channel {cfg.hbm_channel_mbytes} MiB but a "
                          f"pseudo-channel of {target.name} holds {size} MiB")
    out = {hbm_port(channel): f"HBM[{channel}]" for channel in range(cfg.hbm_channels)}
    out.update(prog=f"HBM[{banks - 1}]", host=f"HBM[{banks - 2}]")
    return {port: out[port] for port in master_ports(cfg)}


# --- kernel.xml -----------------------------------------------------------------------------------------------------

def _xml(kernel: str, protocol: str, interrupt: bool, ports: list[dict], args: list[dict]) -> str:
    root = ET.Element("root", versionMajor="1", versionMinor="6")
    element = ET.SubElement(root, "kernel", name=kernel, language="ip_c", vlnv=f"{VENDOR}:{LIBRARY}:{kernel}:{VERSION}",
                            attributes="", preferredWorkGroupSizeMultiple="0", workGroupSize="1",
                            interrupt=str(interrupt).lower(), hwControlProtocol=protocol)
    for tag, items in (("ports", ports), ("args", args)):
        parent = ET.SubElement(element, tag)
        for item in items:
            ET.SubElement(parent, tag[:-1], {key: str(value) for key, value in item.items()})
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _stream_port(name: str, mode: str, bits: int) -> dict:
    return {"name": name, "mode": mode, "dataWidth": bits, "portType": "stream"}


def _stream_arg(name: str, ident: int, bits: int) -> dict:
    """A stream argument: no register (offset and size 0, as Vitis writes them for free-running streams)."""
    return {"name": name, "addressQualifier": 4, "id": ident, "port": name, "size": "0x0", "offset": "0x0",
            "hostOffset": "0x0", "hostSize": "0x0", "type": f"stream<ap_axiu<{bits},0,0,0>>&"}


def kernel_xml(cfg: ArchConfig) -> str:
    """kernel.xml of ringgpt_kernel: its ports and the registers.py arguments, ap_ctrl_hs with an interrupt."""
    ports = [{"name": "s_axi_control", "mode": "slave", "range": hex(1 << ADDRESS_BITS), "dataWidth": DATA_BITS,
              "portType": "addressable", "base": "0x0"}]
    ports += [{"name": f"m_axi_{port}", "mode": "master", "range": "0xFFFFFFFFFFFFFFFF",
               "dataWidth": master_width(cfg, port), "portType": "addressable", "base": "0x0"}
              for port in master_ports(cfg)]
    bits = ring_width(cfg)
    ports += [_stream_port("ring_tx", "write_only", bits), _stream_port("ring_rx", "read_only", bits)]
    args = []
    for ident, reg in enumerate(r for r in register_map(cfg) if r.kind != "status"):
        pointer = reg.kind == "pointer"
        args.append({"name": reg.name, "addressQualifier": int(pointer), "id": ident,
                     "port": f"m_axi_{reg.port}" if pointer else "s_axi_control", "size": hex(reg.bits // 8),
                     "offset": hex(reg.offset), "hostOffset": "0x0", "hostSize": hex(reg.bits // 8),
                     "type": "void*" if pointer else "unsigned int"})
    args += [_stream_arg("ring_tx", len(args), bits), _stream_arg("ring_rx", len(args) + 1, bits)]
    return _xml(KERNEL_MODULE, "ap_ctrl_hs", True, ports, args)


def aurora_xml(cfg: ArchConfig) -> str:
    """kernel.xml of ringgpt_aurora: free running (ap_ctrl_none), two streams of the ring's width."""
    bits = ring_width(cfg)
    ports = [_stream_port("tx_axis", "read_only", bits), _stream_port("rx_axis", "write_only", bits)]
    return _xml(AURORA_MODULE, "ap_ctrl_none", False, ports, [_stream_arg("tx_axis", 0, bits),
                                                                _stream_arg("rx_axis", 1, bits)])


# --- Vivado: package the kernel --------------------------------------------------------------------------------------

_TCL_HELPERS = """\
set here [file dirname [file normalize [info script]]]
set work [file join $here {work}]

# infers a bus interface unless packaging already did
proc infer_bus {{core name vlnv}} {{
    if {{[llength [ipx::get_bus_interfaces $name -of_objects $core]] == 0}} {{
        ipx::infer_bus_interface $name $vlnv $core
    }}
}}

proc set_bus_parameter {{core busif name value}} {{
    set intf [ipx::get_bus_interfaces $busif -of_objects $core]
    if {{[llength [ipx::get_bus_parameters $name -of_objects $intf]] == 0}} {{
        ipx::add_bus_parameter $name $intf
    }}
    set_property value $value [ipx::get_bus_parameters $name -of_objects $intf]
}}
"""


def _header(cfg: ArchConfig, what: str) -> str:
    return (f"# Generated by ringgpt (hw/kernel/vitis.py) for config {cfg.name} (hash {cfg.hash}): {what}.\n"
            "# Do not edit: scripts/build_bitstream.py writes it again. Run: vivado -mode batch -source <this file>\n")


def _package(module: str, part: str, sources: list[str], constraints: list[str], setup: tuple = ()) -> str:
    """Tcl: a project with `setup` (Tcl lines) and `sources`, packaged as IP work/<module>_ip, the core in $core."""
    lines = [f"file delete -force [file join $work {module}_project] [file join $work {module}_ip]",
             f"create_project -force {module} [file join $work {module}_project] -part {part}", *setup]
    lines += [f"add_files -norecurse [file join $here {name}]" for name in sources]
    lines += [f"add_files -fileset constrs_1 -norecurse [file join $here {name}]" for name in constraints]
    lines += [f"set_property top {module} [current_fileset]", "update_compile_order -fileset sources_1",
              f"ipx::package_project -root_dir [file join $work {module}_ip] -vendor {VENDOR} -library {LIBRARY} "
              "-taxonomy /KernelIP -import_files -set_current true",
              "set core [ipx::current_core]",
              "infer_bus $core ap_clk xilinx.com:signal:clock_rtl:1.0",
              "infer_bus $core ap_rst_n xilinx.com:signal:reset_rtl:1.0",
              "set_bus_parameter $core ap_rst_n POLARITY ACTIVE_LOW"]
    return "\n".join(lines) + "\n"


def _package_xo(module: str, protocol: str, xml: str) -> str:
    lines = ["set_property sdx_kernel true $core", "set_property sdx_kernel_type rtl $core",
             f"set_property vitis_drc {{ctrl_protocol {protocol}}} $core",
             "set_property ipi_drc {ignore_freq_hz true} $core",
             "ipx::create_xgui_files $core", "ipx::update_checksums $core", "ipx::check_integrity -kernel -xrt $core",
             "ipx::save_core $core",
             f"package_xo -force -xo_path [file join $work {module}.xo] -kernel_name {module} "
             f"-ip_directory [file join $work {module}_ip] -kernel_xml [file join $here {xml}]"]
    return "\n".join(lines) + "\n"


def xo_files(cfg: ArchConfig) -> list[str]:
    """The .xo files the packaging Tcl scripts make, relative to the build folder."""
    modules = [KERNEL_MODULE] + ([AURORA_MODULE] if cfg.cards > 1 else [])
    return [f"{WORK}/{module}.xo" for module in modules]


def package_kernel_tcl(cfg: ArchConfig, target: Platform) -> str:
    """Vivado Tcl: ringgpt_kernel.v -> IP (ap_clk with every bus, active-low ap_rst_n, level interrupt, the
    registers.py map with each pointer's m_axi port) -> work/ringgpt_kernel.xo with kernel.xml."""
    busifs = ["s_axi_control", *(f"m_axi_{port}" for port in master_ports(cfg)), "ring_tx", "ring_rx"]
    lines = [_header(cfg, f"packages {KERNEL_MODULE}.v as a Vitis RTL kernel"), _TCL_HELPERS.format(work=WORK),
             _package(KERNEL_MODULE, target.part, [f"{KERNEL_MODULE}.v"], []),
             "infer_bus $core interrupt xilinx.com:signal:interrupt_rtl:1.0",
             "set_bus_parameter $core interrupt SENSITIVITY LEVEL_HIGH",
             *(f"ipx::associate_bus_interfaces -busif {busif} -clock ap_clk $core" for busif in busifs),
             "ipx::associate_bus_interfaces -clock ap_clk -reset ap_rst_n $core", "",
             "# the register map (hw/kernel/registers.py)",
             "set block [ipx::get_address_blocks reg0 -of_objects \\\n"
             "    [ipx::get_memory_maps s_axi_control -of_objects $core]]",
             f"set_property range {1 << ADDRESS_BITS} $block",
             "proc kernel_register {block name offset bits description} {",
             "    set register [ipx::add_register $name $block]",
             "    set_property address_offset $offset $register",
             "    set_property size $bits $register",
             "    set_property description $description $register",
             "    return $register",
             "}"]
    fixed = (("CTRL", CONTROL, "ap_ctrl_hs control"), ("GIER", GIE, "global interrupt enable"),
             ("IP_IER", IER, "interrupt enable"), ("IP_ISR", ISR, "interrupt status"))
    lines += [f"kernel_register $block {name} {offset:#x} {DATA_BITS} {{{doc}}}" for name, offset, doc in fixed]
    for reg in register_map(cfg):
        call = f"kernel_register $block {reg.name} {reg.offset:#x} {reg.bits} {{{reg.doc}}}"
        if reg.kind == "pointer":
            lines += [f"set register [{call}]", "ipx::add_register_parameter ASSOCIATED_BUSIF $register",
                      f"set_property value m_axi_{reg.port} [ipx::get_register_parameters ASSOCIATED_BUSIF "
                      "-of_objects $register]"]
        else:
            lines.append(call)
    lines += ["", _package_xo(KERNEL_MODULE, "ap_ctrl_hs", KERNEL_XML)]
    return "\n".join(lines)


# --- v++ --link ------------------------------------------------------------------------------------------------------

def link_config(cfg: ArchConfig, target: Platform, floorplan: str | None = None) -> str:
    """The v++ --link configuration (see the module docstring); `floorplan`: the absolute path of the Tcl that puts
    the core's units in the SLRs' pblocks (hw/kernel/floorplan.py), run before opt_design, or None."""
    kernel, aurora = instance(KERNEL_MODULE), instance(AURORA_MODULE)
    lines = [f"# Generated by ringgpt (hw/kernel/vitis.py) for config {cfg.name} (hash {cfg.hash}) on {target.name}.",
             "[connectivity]", f"nk={KERNEL_MODULE}:1:{kernel}",
             f"# no slr= for {kernel}: a u280 core is estimated at 3/4 of the device, more than one SLR holds" +
             ("; the floorplan Tcl places its units per SLR instead" if floorplan else "")]
    lines += [f"sp={kernel}.m_axi_{port}:{bank}" for port, bank in memory_banks(cfg, target).items()]
    if cfg.cards == 1:
        lines += ["# one card: the ring closes on chip", f"stream_connect={kernel}.ring_tx:{kernel}.ring_rx"]
    else:
        lines += ["# the ring: out of QSFP0 to the next card, in from the previous card on QSFP1",
                  f"nk={AURORA_MODULE}:1:{aurora}", f"slr={aurora}:{target.link_slr}",
                  f"stream_connect={kernel}.ring_tx:{aurora}.tx_axis",
                  f"stream_connect={aurora}.rx_axis:{kernel}.ring_rx"]
        for cage, (gt, refclk) in enumerate(target.qsfp):
            lines += [f"connect={refclk}:{aurora}/gt_refclk_{cage}", f"connect={aurora}/gt_port_{cage}:{gt}"]
        lines.append(f"connect={aurora}/init_clk:{target.free_running_clock}")
    if floorplan:
        lines += ["[vivado]", "# a Tcl script before a step of implementation: UG1393 (2022.2) 'Using the -vivado and "
                  "-advanced Options', --vivado.prop run.impl_1.STEPS.<STEP>.TCL.PRE",
                  f"prop=run.impl_1.STEPS.OPT_DESIGN.TCL.PRE={floorplan}"]
    return "\n".join(lines) + "\n"


def link_command(cfg: ArchConfig, target: Platform, xclbin: str) -> list[str]:
    """The v++ --link command, run in the build's work folder, writing `xclbin` there."""
    return ["v++", "--link", "--target", "hw", "--platform", target.name, "--kernel_frequency", f"{cfg.clock_mhz:g}",
            "--config", f"../{LINK_CFG}", "--temp_dir", "_x", "--log_dir", "logs", "--report_dir", "reports",
            "--output", xclbin, *(name.removeprefix(f"{WORK}/") for name in xo_files(cfg))]


# --- the ring's QSFP28 links ----------------------------------------------------------------------------------------

def _aurora_ip_tcl(cfg: ArchConfig) -> list[str]:
    bits, beat_bytes = ring_width(cfg), ring_width(cfg) // 8
    rx_depth = LINK_RX_FIFO_BYTES // beat_bytes
    ips = [("aurora_64b66b", f"{AURORA_MODULE}_qsfp{cage}",
            {"C_AURORA_LANES": AURORA_LANES, "C_LINE_RATE": AURORA_LINE_GBPS, "C_REFCLK_FREQUENCY": AURORA_REFCLK_MHZ,
             "C_INIT_CLK": AURORA_INIT_CLK_MHZ, "INS_LOSS_NYQ": 8, "RX_EQ_MODE": "LPM", "interface_mode": "Framing",
             "flow_mode": "Immediate_NFC", "crc_mode": "false", "drp_mode": "Native", "SupportLevel": 1})
           for cage in (0, 1)]
    ips += [("axis_data_fifo", f"{AURORA_MODULE}_tx_fifo",
             {"TDATA_NUM_BYTES": beat_bytes, "IS_ACLK_ASYNC": 1, "FIFO_DEPTH": LINK_TX_FIFO_BEATS, "HAS_TLAST": 1}),
            ("axis_data_fifo", f"{AURORA_MODULE}_rx_fifo",
             {"TDATA_NUM_BYTES": beat_bytes, "IS_ACLK_ASYNC": 1, "FIFO_DEPTH": rx_depth, "HAS_TLAST": 1,
              "HAS_PROG_FULL": 1, "PROG_FULL_THRESH": rx_depth // 2, "HAS_PROG_EMPTY": 1,
              "PROG_EMPTY_THRESH": rx_depth // 8})]
    if bits > AURORA_BITS:
        ips += [("axis_dwidth_converter", f"{AURORA_MODULE}_tx_width",
                 {"S_TDATA_NUM_BYTES": beat_bytes, "M_TDATA_NUM_BYTES": AURORA_BITS // 8, "HAS_TLAST": 1}),
                ("axis_dwidth_converter", f"{AURORA_MODULE}_rx_width",
                 {"S_TDATA_NUM_BYTES": AURORA_BITS // 8, "M_TDATA_NUM_BYTES": beat_bytes, "HAS_TLAST": 1})]
    lines = ["# the Xilinx IP the wrapper instantiates (added to the project)",
             "set ip_dir [file join $work aurora_ip]", "file delete -force $ip_dir"]
    for name, module, config in ips:
        settings = " ".join(f"CONFIG.{key} {{{value}}}" for key, value in config.items())
        lines += [f"create_ip -name {name} -vendor xilinx.com -library ip -version {AURORA_IP[name]} "
                  f"-module_name {module} -dir $ip_dir",
                  f"set_property -dict [list {settings}] [get_ips {module}]"]
    lines.append("generate_target all [get_ips]")
    return lines


def package_aurora_tcl(cfg: ArchConfig, target: Platform) -> str:
    """Vivado Tcl: the Aurora, FIFO and width-converter IP, then ringgpt_aurora.v -> IP with a GT port and a reference
    clock per QSFP28 cage and init_clk left a plain port (link.cfg connects it) -> work/ringgpt_aurora.xo."""
    lines = [_header(cfg, f"generates the Aurora 64B/66B IP and packages {AURORA_VERILOG} as a Vitis RTL kernel"),
             _TCL_HELPERS.format(work=WORK),
             _package(AURORA_MODULE, target.part, [AURORA_VERILOG], [AURORA_XDC], setup=_aurora_ip_tcl(cfg)),
             "if {[llength [ipx::get_bus_interfaces init_clk -of_objects $core]] > 0} {",
             "    ipx::remove_bus_interface init_clk $core", "}",
             *(f"ipx::associate_bus_interfaces -busif {busif} -clock ap_clk $core" for busif in ("tx_axis", "rx_axis")),
             "ipx::associate_bus_interfaces -clock ap_clk -reset ap_rst_n $core"]
    for cage in range(len(target.qsfp)):
        gt, clock = f"gt_port_{cage}", f"gt_refclk_{cage}"
        lines += [f"ipx::add_bus_interface {gt} $core",
                  f"set_property interface_mode master [ipx::get_bus_interfaces {gt} -of_objects $core]",
                  f"set_property abstraction_type_vlnv xilinx.com:interface:gt_rtl:1.0 "
                  f"[ipx::get_bus_interfaces {gt} -of_objects $core]",
                  f"set_property bus_type_vlnv xilinx.com:interface:gt:1.0 "
                  f"[ipx::get_bus_interfaces {gt} -of_objects $core]"]
        for logical, physical in (("GRX_P", "rxp_in"), ("GRX_N", "rxn_in"), ("GTX_P", "txp_out"), ("GTX_N", "txn_out")):
            lines += [f"ipx::add_port_map {logical} [ipx::get_bus_interfaces {gt} -of_objects $core]",
                      f"set_property physical_name gt_{cage}_{physical} [ipx::get_port_maps {logical} -of_objects "
                      f"[ipx::get_bus_interfaces {gt} -of_objects $core]]"]
        lines += [f"ipx::add_bus_interface {clock} $core",
                  f"set_property interface_mode slave [ipx::get_bus_interfaces {clock} -of_objects $core]",
                  f"set_property abstraction_type_vlnv xilinx.com:interface:diff_clock_rtl:1.0 "
                  f"[ipx::get_bus_interfaces {clock} -of_objects $core]",
                  f"set_property bus_type_vlnv xilinx.com:interface:diff_clock:1.0 "
                  f"[ipx::get_bus_interfaces {clock} -of_objects $core]"]
        for logical, physical in (("CLK_P", "p"), ("CLK_N", "n")):
            lines += [f"ipx::add_port_map {logical} [ipx::get_bus_interfaces {clock} -of_objects $core]",
                      f"set_property physical_name {clock}_{physical} [ipx::get_port_maps {logical} -of_objects "
                      f"[ipx::get_bus_interfaces {clock} -of_objects $core]]"]
    lines += ["ipx::update_source_project_archive -component $core", "",
              _package_xo(AURORA_MODULE, "ap_ctrl_none", AURORA_XML)]
    return "\n".join(lines)


def aurora_xdc(cfg: ArchConfig) -> str:
    """The reference clocks of the two cages (the Aurora IP does not constrain its top-level refclk pins)."""
    period = 1e3 / AURORA_REFCLK_MHZ
    lines = [f"# Generated by ringgpt (hw/kernel/vitis.py) for config {cfg.name}: QSFP28 reference clocks, "
             f"{AURORA_REFCLK_MHZ} MHz."]
    for cage in (0, 1):
        lines += [f"create_clock -name gt_refclk_{cage} -period {period:.3f} [get_ports gt_refclk_{cage}_p]",
                  f"set_clock_groups -asynchronous -group [get_clocks gt_refclk_{cage} -include_generated_clocks]"]
    return "\n".join(lines) + "\n"


def _aurora_core(cage: int, transmit: str, receive: str, nfc: str) -> str:
    """Instance of the cage's Aurora core; `transmit`, `receive` and `nfc` connect its user-side ports."""
    drp = "".join(f"        .gt{lane}_drpaddr(10'd0), .gt{lane}_drpdi(16'd0), .gt{lane}_drpwe(1'b0), "
                  f".gt{lane}_drpen(1'b0), .gt{lane}_drprdy(), .gt{lane}_drpdo(),\n" for lane in range(AURORA_LANES))
    return f"""    {AURORA_MODULE}_qsfp{cage} qsfp{cage} (
        .rxp(gt_{cage}_rxp_in), .rxn(gt_{cage}_rxn_in), .txp(gt_{cage}_txp_out), .txn(gt_{cage}_txn_out),
        .gt_refclk1_p(gt_refclk_{cage}_p), .gt_refclk1_n(gt_refclk_{cage}_n), .init_clk(init_clk),
        .reset_pb(reset_pb), .pma_init(pma_init), .power_down(1'b0), .loopback(3'b000), .gt_rxcdrovrden_in(1'b0),
        .user_clk_out(user_clk_{cage}), .sync_clk_out(), .tx_out_clk(), .gt_refclk1_out(),
{transmit},
{receive},
{nfc},
        .channel_up(), .lane_up(), .hard_err(), .soft_err(), .gt_pll_lock(), .mmcm_not_locked_out(), .gt_powergood(),
        .link_reset_out(), .sys_reset_out(), .gt_reset_out(), .gt_qpllclk_quad1_out(), .gt_qpllrefclk_quad1_out(),
        .gt_qpllrefclklost_quad1_out(), .gt_qplllock_quad1_out(),
{drp.rstrip().rstrip(',')}
    );
"""


def aurora_verilog(cfg: ArchConfig) -> str:
    """The ringgpt_aurora kernel's top (see the module docstring): Xilinx IP generated by package_aurora.tcl, a reset
    sequence for the cores and the receive side's flow control."""
    W, A, keep = ring_width(cfg), AURORA_BITS, AURORA_BITS // 8
    wide = W > A
    pad = "" if W >= A else f"{A - W}'d0, "
    if wide:
        transmit_path = f"""    {AURORA_MODULE}_tx_width tx_width (
        .aclk(user_clk_0), .aresetn(rst_n_user_0),
        .s_axis_tdata(tx_fifo_tdata), .s_axis_tlast(tx_fifo_tlast), .s_axis_tvalid(tx_fifo_tvalid),
        .s_axis_tready(tx_fifo_tready),
        .m_axis_tdata(link_tx_tdata), .m_axis_tlast(link_tx_tlast), .m_axis_tvalid(link_tx_tvalid),
        .m_axis_tready(link_tx_tready));
"""
        receive_path = f"""    // Aurora cannot wait: the converter always can, the FIFO behind it has room
    {AURORA_MODULE}_rx_width rx_width (
        .aclk(user_clk_1), .aresetn(rst_n_user_1),
        .s_axis_tdata(link_rx_tdata), .s_axis_tlast(link_rx_tlast), .s_axis_tvalid(link_rx_tvalid), .s_axis_tready(),
        .m_axis_tdata(rx_fifo_tdata), .m_axis_tlast(rx_fifo_tlast), .m_axis_tvalid(rx_fifo_tvalid),
        .m_axis_tready(rx_fifo_tready));
"""
    else:
        transmit_path = f"""    // one ring beat per Aurora beat, in its low bits
    assign link_tx_tdata = {{{pad}tx_fifo_tdata}};
    assign link_tx_tlast = tx_fifo_tlast;
    assign link_tx_tvalid = tx_fifo_tvalid;
    assign tx_fifo_tready = link_tx_tready;
"""
        receive_path = f"""    assign rx_fifo_tdata = link_rx_tdata[{W - 1}:0];
    assign rx_fifo_tlast = link_rx_tlast;
    assign rx_fifo_tvalid = link_rx_tvalid;
"""
    qsfp0 = _aurora_core(
        0, f"        .s_axi_tx_tdata(link_tx_tdata), .s_axi_tx_tkeep({{{keep}{{1'b1}}}}),\n"
           "        .s_axi_tx_tlast(link_tx_tlast), .s_axi_tx_tvalid(link_tx_tvalid), .s_axi_tx_tready(link_tx_tready)",
        "        .m_axi_rx_tdata(), .m_axi_rx_tkeep(), .m_axi_rx_tlast(), .m_axi_rx_tvalid()",
        "        .s_axi_nfc_tvalid(1'b0), .s_axi_nfc_tdata(16'd0), .s_axi_nfc_tready()")
    qsfp1 = _aurora_core(
        1, f"        .s_axi_tx_tdata({A}'d0), .s_axi_tx_tkeep({keep}'d0), .s_axi_tx_tlast(1'b0),\n"
           "        .s_axi_tx_tvalid(1'b0), .s_axi_tx_tready()",
        "        .m_axi_rx_tdata(link_rx_tdata), .m_axi_rx_tkeep(), .m_axi_rx_tlast(link_rx_tlast),\n"
        "        .m_axi_rx_tvalid(link_rx_tvalid)",
        f"        .s_axi_nfc_tvalid(nfc_tvalid), .s_axi_nfc_tdata(paused ? 16'h{NFC_XOFF:04x} : 16'h{NFC_XON:04x}),\n"
        "        .s_axi_nfc_tready(nfc_tready)")
    ports = ",\n".join(f"    {p}" for p in (
        "input  wire ap_clk", "input  wire ap_rst_n", "input  wire init_clk",
        f"input  wire [{W - 1}:0] tx_axis_tdata", "input  wire tx_axis_tlast", "input  wire tx_axis_tvalid",
        "output wire tx_axis_tready",
        f"output wire [{W - 1}:0] rx_axis_tdata", "output wire rx_axis_tlast", "output wire rx_axis_tvalid",
        "input  wire rx_axis_tready",
        *(p for cage in (0, 1) for p in (
            f"input  wire gt_refclk_{cage}_p", f"input  wire gt_refclk_{cage}_n",
            *(f"input  wire [{AURORA_LANES - 1}:0] gt_{cage}_{pin}_in" for pin in ("rxp", "rxn")),
            *(f"output wire [{AURORA_LANES - 1}:0] gt_{cage}_{pin}_out" for pin in ("txp", "txn"))))))
    return f"""// Generated by ringgpt (hw/kernel/vitis.py) for config {cfg.name} (hash {cfg.hash}). Do not edit.
// The ring's links (docs in hw/kernel/vitis.py): tx_axis beats leave over QSFP0 to the next card; beats from the
// previous card arrive over QSFP1 on rx_axis. Each cage runs an Aurora 64B/66B core ({AURORA_LANES} x
// {AURORA_LINE_GBPS} Gb/s, {A}-bit beats on its user_clk); the receive FIFO asks the previous card to pause
// (NFC XOFF) when half full and to resume (XON) when below an eighth, since Aurora's receive side cannot be held.
// init_clk: the platform's {AURORA_INIT_CLK_MHZ} MHz free-running clock (the cores' reset sequence).
`default_nettype none
module {AURORA_MODULE} (
{ports}
);
    wire user_clk_0, user_clk_1;

    // --- the cores' reset: pma_init, then reset_pb, released 2**{RESET_COUNTER_BITS} init_clk cycles after ap_rst_n
    wire rst_n_init, rst_n_user_0, rst_n_user_1;
    xpm_cdc_async_rst reset_to_init (.src_arst(ap_rst_n), .dest_clk(init_clk), .dest_arst(rst_n_init));
    xpm_cdc_async_rst reset_to_user_0 (.src_arst(ap_rst_n), .dest_clk(user_clk_0), .dest_arst(rst_n_user_0));
    xpm_cdc_async_rst reset_to_user_1 (.src_arst(ap_rst_n), .dest_clk(user_clk_1), .dest_arst(rst_n_user_1));
    reg reset_pb, pma_init;
    reg [{RESET_COUNTER_BITS - 1}:0] reset_count;
    always @(posedge init_clk or negedge rst_n_init) begin
        if (!rst_n_init) begin
            reset_pb <= 1'b1;
            pma_init <= 1'b1;
            reset_count <= {RESET_COUNTER_BITS}'d0;
        end else begin
            if (~&reset_count) reset_count <= reset_count + 1'b1;
            if (reset_count == {{{{{RESET_COUNTER_BITS - 8}{{1'b1}}}}, 8'd0}}) pma_init <= 1'b0;
            if (&reset_count) reset_pb <= 1'b0;
        end
    end

    // --- transmit: ap_clk -> user_clk_0 -> QSFP0
    wire [{W - 1}:0] tx_fifo_tdata;
    wire tx_fifo_tlast, tx_fifo_tvalid, tx_fifo_tready;
    wire [{A - 1}:0] link_tx_tdata;
    wire link_tx_tlast, link_tx_tvalid, link_tx_tready;
    {AURORA_MODULE}_tx_fifo tx_fifo (
        .s_axis_aresetn(ap_rst_n), .s_axis_aclk(ap_clk),
        .s_axis_tdata(tx_axis_tdata), .s_axis_tlast(tx_axis_tlast), .s_axis_tvalid(tx_axis_tvalid),
        .s_axis_tready(tx_axis_tready),
        .m_axis_aclk(user_clk_0),
        .m_axis_tdata(tx_fifo_tdata), .m_axis_tlast(tx_fifo_tlast), .m_axis_tvalid(tx_fifo_tvalid),
        .m_axis_tready(tx_fifo_tready));
{transmit_path}
{qsfp0}
    // --- receive: QSFP1 -> user_clk_1 -> ap_clk
    wire [{A - 1}:0] link_rx_tdata;
    wire link_rx_tlast, link_rx_tvalid;
    wire [{W - 1}:0] rx_fifo_tdata;
    wire rx_fifo_tlast, rx_fifo_tvalid, rx_fifo_tready;
    wire rx_prog_full;        // user_clk_1 (the FIFO's write side)
    wire rx_prog_empty;       // ap_clk (its read side)
    wire rx_prog_empty_user;
{receive_path}
    {AURORA_MODULE}_rx_fifo rx_fifo (
        .s_axis_aresetn(rst_n_user_1), .s_axis_aclk(user_clk_1),
        .s_axis_tdata(rx_fifo_tdata), .s_axis_tlast(rx_fifo_tlast), .s_axis_tvalid(rx_fifo_tvalid),
        .s_axis_tready(rx_fifo_tready),
        .m_axis_aclk(ap_clk),
        .m_axis_tdata(rx_axis_tdata), .m_axis_tlast(rx_axis_tlast), .m_axis_tvalid(rx_axis_tvalid),
        .m_axis_tready(rx_axis_tready),
        .prog_full(rx_prog_full), .prog_empty(rx_prog_empty));
    xpm_cdc_single rx_prog_empty_sync (.src_clk(ap_clk), .src_in(rx_prog_empty), .dest_clk(user_clk_1),
                                       .dest_out(rx_prog_empty_user));

    // native flow control: XOFF once the FIFO is half full, XON once it is below an eighth
    reg paused, nfc_tvalid;
    wire nfc_tready;
    always @(posedge user_clk_1) begin
        if (!rst_n_user_1) begin
            paused <= 1'b0;
            nfc_tvalid <= 1'b0;
        end else if (nfc_tvalid) begin
            if (nfc_tready) nfc_tvalid <= 1'b0;
        end else if (!paused && rx_prog_full) begin
            paused <= 1'b1;
            nfc_tvalid <= 1'b1;
        end else if (paused && rx_prog_empty_user) begin
            paused <= 1'b0;
            nfc_tvalid <= 1'b1;
        end
    end
{qsfp1}endmodule
`default_nettype wire
"""


def vitis_files(cfg: ArchConfig, target: Platform, floorplan: str | None = None) -> dict[str, str]:
    """Every file the build writes beside the kernel's Verilog: {name in the build folder: text}; `floorplan` as
    link_config's (the build writes that Tcl)."""
    files = {KERNEL_XML: kernel_xml(cfg), KERNEL_TCL: package_kernel_tcl(cfg, target),
             LINK_CFG: link_config(cfg, target, floorplan)}
    if cfg.cards > 1:
        files.update({AURORA_VERILOG: aurora_verilog(cfg), AURORA_XML: aurora_xml(cfg), AURORA_XDC: aurora_xdc(cfg),
                      AURORA_TCL: package_aurora_tcl(cfg, target)})
    return files


def packaging_scripts(cfg: ArchConfig) -> list[str]:
    """The Tcl scripts Vivado runs, in order."""
    return [KERNEL_TCL] + ([AURORA_TCL] if cfg.cards > 1 else [])
