"""Verilog of an Amaranth component with each distinct module written once.

Amaranth writes one module per instance, so the u280 core's 16 MAC trees, 33 AXI port engines and 64 vector lanes
are each written out in full (76 MB of Verilog for the core, 56 minutes of Verilator to translate it).
`convert` merges the modules that `hw/netlist.module_digests` finds equal (`netlist.deduplicate`) before Yosys
writes the Verilog, the conversion Amaranth's own `verilog.convert` makes (the same Yosys script), so that simulators
and Vivado read every module once and instantiate it many times.
"""
from __future__ import annotations

from amaranth.back import rtlil
from amaranth.back.verilog import _convert_rtlil_text

from ringgpt.hw.netlist import deduplicate


def convert(component, name: str) -> str:
    """Verilog of `component` (a `wiring.Component`), top module `name`, one module per distinct design; names of
    instances and of the top's ports as Amaranth's `verilog.convert` writes them."""
    return _convert_rtlil_text(deduplicate(rtlil.convert(component, name=name, emit_src=False)))
