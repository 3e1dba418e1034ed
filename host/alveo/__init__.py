"""The appliance on Alveo U280 boards: AlveoDevice (driver.py) over a platform of kernels (platform.py: the
protocol, and PynqPlatform for the boards; sim/rtl/kernel_platform.py runs the same driver on the kernel's RTL).
Importing this package needs no PYNQ: the boards' back end imports it when it opens them."""
from .driver import AlveoDevice, RunTimeoutError, check_boards, check_manifest, default_manifest
from .platform import AlveoUnavailableError, PynqPlatform

__all__ = ["AlveoDevice", "AlveoUnavailableError", "PynqPlatform", "RunTimeoutError", "check_boards",
           "check_manifest", "default_manifest"]
