"""The compiler: a GPT-2 model in, an appliance image out (see docs/compiler.md)."""
from ringgpt.host.compiler.build import COMPILER_VERSION, DEFAULT_WBUF_SLOTS, compile_model
from ringgpt.host.compiler.errors import CapacityError, CompileError
from ringgpt.host.compiler.partition import Partition, partition, split

__all__ = ["COMPILER_VERSION", "DEFAULT_WBUF_SLOTS", "CapacityError", "CompileError", "Partition", "compile_model",
           "partition", "split"]
