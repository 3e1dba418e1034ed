"""The executing units' classes, one registry for the core (`core.py`) and the single-instruction harness
(`datapath.py`): by the lower-case name of each member of isa.EXECUTING_UNITS, in that order."""
from __future__ import annotations

from ringgpt.hw.isa import EXECUTING_UNITS

from .dma import DMAUnit
from .matrix import MatrixUnit
from .router import Router
from .vector import VectorUnit

UNIT_CLASSES = {"dma": DMAUnit, "matrix": MatrixUnit, "vector": VectorUnit, "router": Router}
UNIT_NAMES = tuple(unit.name.lower() for unit in EXECUTING_UNITS)
if tuple(UNIT_CLASSES) != UNIT_NAMES:
    raise ImportError(f"hw/core/units.py: units {tuple(UNIT_CLASSES)} do not match the ISA's {UNIT_NAMES}")
