"""The cycle model: what every instruction costs on the micro-architecture (`instruction_cost`, the
one place every cost formula lives, calibrated against the RTL's cycle counts: docs/rtl-calibration.md), and how
much of that the controller and scoreboard let overlap (`schedule`, the RTL controller's in-order issue with
fetch, unit queues and hazards, all cards jointly). Its input is the functional simulator's trace: each executed
instruction with every register-relative field resolved (`Resolved`). Definitions: docs/cycle-model.md.

    timing.py     the units' pipeline depths and overheads (`unit_timing`, from hw/core/timing.py)
    costs.py      per-instruction costs (`instruction_cost`, `link_excess`, `instruction_class`)
    stalls.py     bank stalls of the matrix and vector units' tiles (`matrix_stall_cycles`, `vector_stall_cycles`)
    hbm.py        the DMA unit's transfers served by HBM and the host link (`dma_cycles`, `hbm_service`)
    fetch.py      when each program word reaches the controller (the fetch unit and its FIFO)
    scheduler.py  the controller's and scoreboard's overlap of all cards (`schedule`)
    report.py     what a schedule reports (`CycleReport`, `CardReport`)
    occupancy.py  where each card's cycles of a run went: HBM, compute, ring, host, issue (`occupancy`)
    worker.py     `schedule` in a second process, fed while the simulator runs (`ScheduleWorker`)
"""
from .costs import Cost, instruction_class, instruction_cost, link_excess
from .fetch import FETCH_REQUEST, FETCH_TO_DECISION
from .hbm import HbmService, dma_cycles, hbm_segments, hbm_service
from .occupancy import card_occupancy, occupancy
from .report import CardReport, CycleReport
from .scheduler import QUEUE_TO_UNIT, schedule
from .stalls import matrix_stall_cycles, vector_operands, vector_stall_cycles, weight_beat_cycles
from .timing import unit_timing

__all__ = ["FETCH_REQUEST", "FETCH_TO_DECISION", "QUEUE_TO_UNIT", "CardReport", "Cost", "CycleReport", "HbmService",
           "card_occupancy", "dma_cycles", "hbm_segments", "hbm_service", "instruction_class", "instruction_cost",
           "link_excess", "matrix_stall_cycles", "occupancy", "schedule", "unit_timing", "vector_operands",
           "vector_stall_cycles", "weight_beat_cycles"]
