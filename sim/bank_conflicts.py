"""Bank conflicts: what the units' and the DMA engines' shared buffer memories cost over a program's resolved
instructions, as scripts/bank_conflicts.py reports it for the compiled u280 programs.

`program_figures`: the matrix unit's busy cycles (the cycle model's instruction_cost) and its stalls
(matrix_stall_cycles), the stalls of its weight reads under candidate bankings (`SCHEMES`, weight_beat_cycles):

* `pow2`:  bank = c mod 16;
* `skew`:  bank = (c + c div 16) mod 16 (skewed storage);
* `prime`: the buffers' own map (hw/banks.py: bank = c mod 17 at u280, ArchConfig.buffer_banks, the smallest prime above
  mpu_lanes; its stalls are what the cycle model charges);

and the vector unit's busy cycles and operand stalls (vector_stall_cycles).

`dma_figures`: the DMA engines (hw/core/port_engine.py, PortEngine) share one write port per memory
for their LOAD beats (an engine merges its beats into whole rows and asks only when a row is complete,
`PortEngine._rows`; each memory takes the first engine's row, `DMAUnit._row_writes`), and one ABUF read for their
STORE beats (`DMAUnit._store_reads`: one beat per cycle in all). For every LOAD and STORE between HBM and ABUF/WBUF
it replays each engine's beats (sim/cycle_model/grants.py, `engine_beats`: the jobs' words through hw/hbm.py's
map) with every engine fed one beat per cycle, or at the HBM's sustained rate (`feed_rate`), granted as the RTL
grants them (`grant_cycles`: the engines behind the leader first), and counts the cycles the grants add over
memories that never conflict (the cycle model charges the LOADs' share, `grant_stall_cycles`).
"""
from __future__ import annotations

from ringgpt.hw.isa import OPCODES, Opcode, Space, Unit
from ringgpt.sim.cycle_model.costs import instruction_cost
from ringgpt.sim.cycle_model.grants import feed_rate, transfer_grants
from ringgpt.sim.cycle_model.timing import unit_timing
from ringgpt.sim.cycle_model.stalls import matrix_stall_cycles, vector_operands, vector_stall_cycles, weight_beat_cycles

SCHEMES = {"pow2": (16, lambda c: c % 16), "skew": (16, lambda c: (c + c // 16) % 16), "prime": (None, None)}


def program_figures(cfg, run) -> dict:
    """The matrix unit's busy cycles, the stalls of its tiles' shared read ports (cycle_model.matrix_stall_cycles:
    weights, x and bias, in its busy cycles) and the weight stalls of each banking; the vector unit's busy cycles
    and the stalls of its operands' shared read port (cycle_model.vector_stall_cycles, in its busy cycles)."""
    out = {"matrix_cycles": 0, "matrix_stalls": 0, **{scheme: 0 for scheme in SCHEMES}, "vector_cycles": 0,
           "vector_stalls": 0}
    cache: dict = {}
    for r in run:
        if r is not None and OPCODES[r.op].unit is Unit.VECTOR and r.rows and r.n:
            out["vector_cycles"] += instruction_cost(r, cfg).cycles
            out["vector_stalls"] += vector_stall_cycles(r.rows, r.n, vector_operands(r, cfg), cfg,
                                                        unit_timing(cfg)["vector"]["step"][r.op])
        if r is None or OPCODES[r.op].unit is not Unit.MATRIX or not (r.rows and r.n and r.k):
            continue
        out["matrix_cycles"] += instruction_cost(r, cfg).cycles
        out["matrix_stalls"] += matrix_stall_cycles(r, cfg)
        key = (r.src2[1] % (17 * 16 * cfg.buffer_chunk_words), r.src2_stride, r.n, r.k)
        if key not in cache:
            cache[key] = {scheme: int((weight_beat_cycles(r.src2[1], r.src2_stride, r.n, r.k, cfg, banks, bank_of)
                                       - 1).sum())
                          for scheme, (banks, bank_of) in SCHEMES.items()}
        for scheme, extra in cache[key].items():
            out[scheme] += r.rows * extra
    out["clock_mhz"] = cfg.clock_mhz
    return out


def dma_figures(cfg, run) -> dict:
    """The grants' extra cycles over the program's LOADs and STOREs between HBM and ABUF/WBUF, at one beat per
    cycle per engine and at the HBM's sustained rate (grants.transfer_grants)."""
    rates = {"port": 1.0, "hbm": feed_rate(cfg)}
    out = {"transfers": 0, **{f"{rate}_cycles": 0 for rate in rates}, **{f"{rate}_extra": 0 for rate in rates}}
    for r in run:
        if r is None or r.op not in (Opcode.LOAD, Opcode.STORE) or not (r.rows and r.n) or r.flags.transpose:
            continue
        write = r.op is Opcode.LOAD
        (x_space, x0), (b_space, b0) = (r.src1, r.dst) if write else (r.dst, r.src1)
        x_stride, b_stride = (r.src1_stride, r.dst_stride) if write else (r.dst_stride, r.src1_stride)
        if x_space is not Space.HBM or b_space not in (Space.ABUF, Space.WBUF):
            continue
        out["transfers"] += 1
        for label, rate in rates.items():
            free, extra = transfer_grants(cfg, r.rows, r.n, x0, x_stride, b0, b_stride, write, rate)
            out[f"{label}_cycles"] += free
            out[f"{label}_extra"] += extra
    return out
