"""The bit-exact functional simulator of the ring of cards, behind the Device interface
(docs/simulator.md). Its errors are ringgpt.host.device's DeviceError family, and StepLimitError."""
from ringgpt.sim.functional.device import DEFAULT_MAX_STEPS, SimulatorDevice
from ringgpt.sim.functional.errors import StepLimitError

__all__ = ["DEFAULT_MAX_STEPS", "SimulatorDevice", "StepLimitError"]
