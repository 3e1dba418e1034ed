"""The compiler: a GPT-2 model in, an appliance image out (see docs/compiler.md).

Its names are imported on first use (PEP 562), so that `ringgpt.host.compiler.dims` (the checks that need no
torch) and the command line's --help stay light."""
from importlib import import_module

from ringgpt.host.compiler.errors import CapacityError, CompileError
from ringgpt.host.compiler.partition import Partition, partition, split

_NAMES = {"COMPILER_VERSION": "build", "DEFAULT_WBUF_SLOTS": "build", "compile_model": "build"}

__all__ = ["COMPILER_VERSION", "DEFAULT_WBUF_SLOTS", "CapacityError", "CompileError", "Partition", "compile_model",
           "partition", "split"]


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
