"""Why a simulated run or a use of the SimulatorDevice failed. Every error a program causes names the
card, the pc and the instruction's assembly text."""
from __future__ import annotations

from ringgpt.host.device import DeviceError


class SimulatorError(DeviceError):
    """A program fault on one card: `card`, `pc` and `instruction` (assembly text, or the raw word)."""

    def __init__(self, card: int, pc: int, instruction: str, problem: str):
        self.card, self.pc, self.instruction, self.problem = card, pc, instruction, problem
        super().__init__(f"card {card} pc {pc} ({instruction}): {problem}")


class IllegalInstructionFault(SimulatorError):
    """A word that does not decode to a legal instruction, or a program without HALT."""


class AddressFault(SimulatorError):
    """An access outside its memory space (or outside the image's HBM map)."""


class AlignmentFault(SimulatorError):
    """A MATMUL's or MASKED_QK's weights (in WBUF) off the matrix unit's boundaries (hw/resolved.misaligned_weights),
    or a LOAD's or GATHER's HBM/host words at other offsets within the beat than their buffer words
    (hw/resolved.misaligned_transfer); the RTL's ErrorCode.MISALIGNED."""


class StepLimitError(SimulatorError):
    """A card executed more instructions in one run than the device's step limit."""


class RingError(DeviceError):
    """A ring protocol failure involving several cards; `cards` lists (card, pc, instruction, state)."""

    def __init__(self, problem: str, cards: list):
        self.problem, self.cards = problem, cards
        lines = [f"  card {c} pc {pc} ({inst}): {state}" for c, pc, inst, state in cards]
        super().__init__("\n".join([problem] + lines))


class RingDeadlockError(RingError):
    """No card can make progress: every card still running waits on a router op that cannot match."""


class CollectiveMismatchError(RingError):
    """Cards met at a collective or a SEND/RECV pair with shapes that do not fit together, or a run
    ended with blocks sent but never received."""


class NotLoadedError(DeviceError):
    """The device was used before an image was loaded."""


class HostAccessError(DeviceError):
    """A host-side read or write outside a card's host buffer, or of data that is not FP16 words."""
