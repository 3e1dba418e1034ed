"""The bit-exact functional simulator of the ring of cards, behind the Device interface
(docs/simulator.md)."""
from ringgpt.sim.functional.device import DEFAULT_MAX_STEPS, SimulatorDevice
from ringgpt.sim.functional.errors import (AddressFault, AlignmentFault, CollectiveMismatchError, HostAccessError,
                                           IllegalInstructionFault, NotLoadedError, RingDeadlockError, RingError,
                                           SimulatorError, StepLimitError)

__all__ = ["DEFAULT_MAX_STEPS", "SimulatorDevice", "AddressFault", "AlignmentFault", "CollectiveMismatchError", "HostAccessError",
           "IllegalInstructionFault", "NotLoadedError", "RingDeadlockError", "RingError", "SimulatorError",
           "StepLimitError"]
