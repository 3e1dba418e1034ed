"""The RTL back end: the cores of a ring simulated together (Verilator or Icarus, through cocotb) behind
the Device interface, so the runtime drives the RTL exactly as it drives the functional simulator."""
