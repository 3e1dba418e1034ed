"""The functional simulator's own error. The errors every back end raises (program faults naming the card, the pc
and the instruction, ring failures, use before load, host-buffer accesses) are the DeviceError family of
ringgpt.host.device."""
from __future__ import annotations

from ringgpt.host.device import AddressFault, AlignmentFault, SimulatorError

__all__ = ["StepLimitError", "AddressFault", "AlignmentFault"]
# AddressFault and AlignmentFault are here only for sim/tb/tb_dma.py's import, until it imports ringgpt.host.device.


class StepLimitError(SimulatorError):
    """A card executed more instructions in one run than the device's step limit."""
