"""The Vitis kernel's AXI4-Lite register map (`s_axi_control`), defined once.

The kernel RTL (hw/kernel/kernel.py), `kernel.xml` (scripts/build_bitstream.py), the PYNQ driver
(host/alveo) and docs/alveo.md all derive from `register_map(cfg)`. Layout, in bytes:

    0x00  control  ap_ctrl_hs: bit 0 ap_start (write 1 to start; reads 1 until the core takes it),
                   bit 1 ap_done (clear on read), bit 2 ap_idle, bit 3 ap_ready (clear on read)
    0x04  GIE      bit 0: global interrupt enable
    0x08  IER      bit 0: interrupt on ap_done, bit 1: on ap_ready
    0x0C  ISR      bit 0: ap_done, bit 1: ap_ready happened (toggle on write: write 1 to clear)
    0x10  arguments, one 8-byte slot each in kernel.xml order (a 32-bit scalar in the low word, a 64-bit
          pointer as low word then high word): pos, rows, card_id, cards, program, host, hbm00 ... hbmNN
    then  read-only status, one 32-bit word each: error, error_pc, pc, cycles, busy_<unit> per executing unit

Every pointer argument belongs to one AXI4 master port (`m_axi_<port>`): `program` to `m_axi_prog`,
`host` to `m_axi_host`, `hbmNN` to `m_axi_hbmNN` (the core's DMA port of HBM pseudo-channel NN, whose
HBM contents the host places in bank NN). Status words are the core's host-interface outputs as they
are after the run (hw/core/core.py STATUS).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.hbm import hbm_port
from ringgpt.hw.isa import EXECUTING_UNITS

CONTROL, GIE, IER, ISR = 0x00, 0x04, 0x08, 0x0C
AP_START, AP_DONE, AP_IDLE, AP_READY = 1 << 0, 1 << 1, 1 << 2, 1 << 3
"""Bits of the control register (ap_ctrl_hs)."""
IRQ_DONE, IRQ_READY = 1 << 0, 1 << 1
"""Bits of IER and ISR."""
ARGUMENTS_BASE = 0x10
SLOT_BYTES = 8
"""Each argument takes one 8-byte slot (a 64-bit pointer fills it; a 32-bit scalar uses the low word)."""
ADDRESS_BITS = 12
"""Width of s_axi_control's byte addresses (the map lies within 4 KiB)."""
DATA_BITS = 32


@dataclass(frozen=True)
class Register:
    """One argument or status word of the map."""
    name: str
    offset: int
    """Byte offset of its (low) word."""
    bits: int
    """32 or 64 (a 64-bit register is two words: low at offset, high at offset + 4)."""
    kind: str
    """'scalar' or 'pointer' (kernel arguments the host writes) or 'status' (read-only)."""
    port: str | None
    """For a pointer: the AXI4 master port its buffer is reached through (prog, host, hbm00, ...)."""
    doc: str


def master_ports(cfg: ArchConfig) -> tuple[str, ...]:
    """The kernel's AXI4 master ports, without `m_axi_`: instruction fetch, HBM channels, host buffer."""
    return ("prog", *(hbm_port(c) for c in range(cfg.hbm_channels)), "host")


def _arguments(cfg: ArchConfig) -> list[tuple]:
    args = [("pos", 32, "scalar", None, "R1 at start: position of the run's first token"),
            ("rows", 32, "scalar", None, "R2 at start: tokens in this run"),
            ("card_id", 32, "scalar", None, "this card's place on the ring, 0 .. cards - 1"),
            ("cards", 32, "scalar", None, "cards on the ring"),
            ("program", 64, "pointer", "prog", "byte address of the program (pc 0), 64-byte aligned"),
            ("host", 64, "pointer", "host", "byte address of the host buffer (FP16 word 0)")]
    args += [(hbm_port(c), 64, "pointer", hbm_port(c), f"byte address of HBM pseudo-channel {c}'s image (local word 0)")
             for c in range(cfg.hbm_channels)]
    return args


def _status() -> list[tuple]:
    status = [("error", "ErrorCode of the run (hw/core/interfaces.py), 0 when none"),
              ("error_pc", "pc of the instruction that stopped the run"),
              ("pc", "pc of the next instruction to issue"),
              ("cycles", "kernel clock cycles from start to halt (wraps at 2**32)")]
    status += [(f"busy_{u.name.lower()}", f"cycles the {u.name.lower()} unit was busy") for u in EXECUTING_UNITS]
    return status


def register_map(cfg: ArchConfig) -> tuple[Register, ...]:
    """Every argument and status register of the kernel for `cfg`, in kernel.xml order, then the status words."""
    regs, offset = [], ARGUMENTS_BASE
    for name, bits, kind, port, doc in _arguments(cfg):
        regs.append(Register(name, offset, bits, kind, port, doc))
        offset += SLOT_BYTES
    for name, doc in _status():
        regs.append(Register(name, offset, 32, "status", None, doc))
        offset += 4
    if offset > 1 << ADDRESS_BITS:
        raise ValueError(f"the register map needs {offset} bytes, more than {ADDRESS_BITS}-bit addresses reach")
    return tuple(regs)


def by_name(cfg: ArchConfig) -> dict[str, Register]:
    return {reg.name: reg for reg in register_map(cfg)}


def map_hash(cfg: ArchConfig) -> str:
    """sha256 of the register map (manifests record it; the driver refuses an image built with another)."""
    fixed = {"control": [CONTROL, GIE, IER, ISR], "bits": [AP_START, AP_DONE, AP_IDLE, AP_READY, IRQ_DONE, IRQ_READY]}
    text = json.dumps({"fixed": fixed, "registers": [asdict(r) for r in register_map(cfg)]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
