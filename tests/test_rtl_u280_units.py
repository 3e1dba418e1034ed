"""The core's units at the `u280` preset's own widths (issue 32, "safety net first"): the same cocotb testbenches
as the sim-small unit tests (tests/test_rtl_vector.py, ...), on the single-instruction harness
`Datapath(unit, config="u280", ...)`, bit-exact with the functional simulator instruction by instruction under the
same random issue gaps, AXI pauses and buffer contention, with fewer random instructions (enough to reach every
opcode).

Buffer depths are small: a buffer's depth changes only its address widths (the row address of each of the 17
memories, `BankedBuffer.rows`, and the range checks' bounds), never the port logic, the chunk of 64 words, the 17
memories or a unit's lanes; each test takes the smallest depth its testbench's random placement and fixed cases
need (a multiple of the 64-word chunk; see each DESIGN).

The RTL tests are `slow` (each build alone is minutes). The buffers at u280's geometry (17 memories of 64-word
chunks, Amaranth's simulator) live in tests/test_rtl_buffers.py, its `[u280...]` cases of the word-array, tile-port
and grant tests (one test body for both geometries), in the default suite. Measured on the 2-core machine
(2026-11-28) while other jobs ran beside them (load average 4 to 7: the wall times are about twice the machine's
alone; "user" is the CPU time of the whole run), Verilator 5.049, C++ at -O0; the matrix row on 2026-11-29 beside one
other build, on the Verilog of `hw/verilog.convert` (each distinct module once), the others before it:

| test | Verilog | Verilator's C++ | build (wall) | peak memory | run (wall) |
|---|---:|---:|---:|---:|---:|
| vector (pass) | 18.3 MB | 123 MB, 171 files | 16 min: conversion 3, Verilator 6 (170 s CPU), C++ 7 | 1.5 GB (Verilator) | 8.8 min |
| router (pass, after the fix below) | 1.8 MB | 19 MB, 26 files | 3.5 min | 0.5 GB | 9.1 min (3.0 of them the regression's 20 cases) |
| DMA (passing so far, see below) | 12.4 MB | 141 MB, 155 files | 17 min: conversion 4, Verilator 2.3, C++ 10 | 1.4 GB (Verilator) | over 40 min |
| matrix with INT8 weights (pass, 2026-11-29, merged modules, beside one other build) | 14.1 MB (FP16 only: 6.1 MB; 18.8 MB before `hw/verilog.convert`) | 350 files | 16 min: conversion 3.2, Verilator and C++ 13 | 3.5 GB | 17 min (12 instructions, 4 of them INT8; FP16 only: 9) |
| buffers, 4 u280 cases (Amaranth; now in tests/test_rtl_buffers.py) | | | | 0.1 GB | 23 s + 11 s + 20 s + 56 s |

The whole vector test took 26.5 min wall, 845 s user. At Verilator's default -Os the vector unit's C++ compiled
109 of its 171 files in 10 minutes (the large `_024root` files 1 to 3 minutes each) and was stopped: about an hour
projected, hence `runner.LARGE_DESIGN_CXX_OPT`.

The DMA test is slow to run, not to build: its 33 cocotbext-axi AxiRams (five channel coroutines each) make the
simulation about 25 cycles a second, and every instruction syncs and dumps ABUF and WBUF (about 650 cycles). In its
first run the on-chip random LOADs, the bad words, the on-chip full rate (busy cycles exactly `DMAUnit.cycles`) and
the 10 random off-chip LOAD / transposed LOAD / STORE / transposed STORE / GATHER (32 HBM ports and the host port,
AXI pauses) passed in 21 minutes. The off-chip errors failed on a testbench assumption, now parameterised: "LOAD past
HBM" started 12 beats before the config's HBM end, which at u280's 32-word beat leaves the 140-word block inside it
(the unit answered BUS from the AxiRams, rightly); it now starts 96 words before the end at either width (not yet
rerun at u280). The off-chip full rate and contention were still running when this was written.

The router test found a real bug at this width, now fixed (hw/core/router.py; regression at sim-small:
tb_router.forward_after_a_refused_write): an ALLGATHER's forwarded slice was read back from ABUF while its last beat
still waited, refused, in the write register, and was sent with the old words.
"""
import pytest

from ringgpt.sim.cocotb_support.runner import LARGE_DESIGN_CXX_OPT, Design

HARNESS = "ringgpt.hw.core.datapath:Datapath"
# Vector unit, 64 lanes. ABUF 16,384 words: the random cases' blocks (up to 13 rows of up to 6 x 64 + 1 words,
# strides up to n + 5: about 5,000 words each, four of them) fit about as often as sim-small's in its 2,048, and the
# full-rate case puts src2 13 periods of the memories (13 x 64 x 17 words) past src1. WBUF: the config's minimum
# (2 x mac_width x mpu_lanes); the vector unit does not use it.
VECTOR = Design.of(HARNESS, unit="vector", config="u280", abuf_words=16384, wbuf_words=2048) \
    .with_cxx_opt(LARGE_DESIGN_CXX_OPT)
VECTOR_INSTRUCTIONS = {"verilator": 22, "icarus": 11}      # every one of the 11 opcodes twice (once on Icarus)


@pytest.mark.rtl
@pytest.mark.slow
def test_u280_vector_unit_bit_exact(run_tb, sim):
    run_tb(VECTOR, "ringgpt.sim.tb.tb_vector", seed=4, instructions=VECTOR_INSTRUCTIONS[sim],
           issue_valid_probability=0.5)


# --- router, DMA, matrix unit -------------------------------------------------------------------------------------

# Router, 64-word payload. ABUF 34,816 words (32 periods of the memories): the testbench's SEND/RECV blocks reach
# 2 x 64 rows of 4 x 64 + 4 words (point_program's largest, which it places without retrying: 33,276 words).
ROUTER = Design.of(HARNESS, unit="router", config="u280", abuf_words=34816, wbuf_words=2048) \
    .with_cxx_opt(LARGE_DESIGN_CXX_OPT)
ROUTER_CASES = {"verilator": 9, "icarus": 3}                # ALLGATHER, SEND, RECV three times each


@pytest.mark.rtl
@pytest.mark.slow
def test_u280_router_bit_exact(run_tb, sim):
    run_tb(ROUTER, "ringgpt.sim.tb.tb_router", seed=3, cases=ROUTER_CASES[sim], issue_valid_probability=0.5,
           link_pause=0.3)


# DMA unit: 32 HBM port engines of 512-bit beats and the host port. ABUF 16,384 words: the on-chip full-rate case's
# transposed 64 x 128 block lands past its source (2 x 64 x 64 words on); WBUF 4,416: its transposed 67 x 65 block
# (4,355 words). The test HBM: 65,536 words, 2,048 (4 KiB) a channel as at sim-small, room for the full-rate
# sequential LOAD and STORE of all of ABUF.
DMA = Design.of(HARNESS, unit="dma", config="u280", abuf_words=16384, wbuf_words=4416) \
    .with_cxx_opt(LARGE_DESIGN_CXX_OPT)
DMA_INSTRUCTIONS = {"verilator": 4, "icarus": 2}           # on-chip LOADs, straight and transposed in turn
DMA_OFFCHIP = {"verilator": 10, "icarus": 5}               # LOAD, transposed LOAD, STORE, transposed STORE, GATHER


@pytest.mark.rtl
@pytest.mark.slow
def test_u280_dma_bit_exact(run_tb, sim):
    run_tb(DMA, "ringgpt.sim.tb.tb_dma", seed=5, instructions=DMA_INSTRUCTIONS[sim], offchip=DMA_OFFCHIP[sim],
           issue_valid_probability=0.5, axi_pause=0.3, hbm_words=65536)


# Matrix unit, 16 lanes x 64 MACs. ABUF 4,096 words: the random x and result blocks (up to 9 rows of up to 325 and
# 84 words); WBUF 16,384: the full-rate cases' weights and the bias 14 periods on (15,344 words; the largest random
# weight blocks, 79 columns up to 384 words apart, are redrawn, as at sim-small).
MATRIX = Design.of(HARNESS, unit="matrix", config="u280", abuf_words=4096, wbuf_words=16384) \
    .with_cxx_opt(LARGE_DESIGN_CXX_OPT)
MATRIX_INSTRUCTIONS = {"verilator": 12, "icarus": 3}       # MATMUL (bias, GELU; FP16, INT8) and MASKED_QK


@pytest.mark.rtl
@pytest.mark.slow
def test_u280_matrix_unit_bit_exact(run_tb, sim):
    run_tb(MATRIX, "ringgpt.sim.tb.tb_matrix", seed=3, instructions=MATRIX_INSTRUCTIONS[sim],
           issue_valid_probability=0.5)
