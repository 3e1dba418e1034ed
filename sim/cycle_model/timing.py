"""The units' pipeline depths and fixed overheads as the cycle model reads them from the units' timing classes
(hw/core/timing.py, which the RTL units inherit)."""
from __future__ import annotations

import functools

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.core.timing import MatrixTiming, VectorTiming
from ringgpt.hw.isa import Unit, opcodes_of


@functools.cache
def unit_timing(cfg: ArchConfig) -> dict:
    """The pipeline depths and fixed overheads of the matrix and vector units of `cfg`, read from the
    units' timing classes (hw/core/timing.py, which the RTL units inherit), not typed into the config."""
    matrix, vector = MatrixTiming(cfg), VectorTiming(cfg)
    return {"matrix": {"latency": matrix.latency, "int8_latency": matrix.int8_latency,
                       "row_max": matrix.row_max_latency, "overhead": matrix.overhead,
                       "loop": matrix.loop_latency},
            "vector": {"latency": dict(vector.latency), "overhead": vector.overhead, "loop": vector.loop_latency,
                       "step": {op: vector.step_words(op) for op in opcodes_of(Unit.VECTOR)}}}
