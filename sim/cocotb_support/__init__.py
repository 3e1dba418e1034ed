"""The reusable cocotb testbench layer: runner (build and run), bench (inside the simulator), pytest plugin."""
