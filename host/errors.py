"""The project's exception hierarchy. Its one root, RingGPTError, is defined in ringgpt.hw.errors (so that the
architecture config and the ISA derive from it too) and re-exported here. Every error a user can cause is a
RingGPTError with a message that says what is wrong, where, and how to fix it; the CLI prints it as one line and
exits with its `exit_code` (2 for bad input, 1 for a failed device run or an internal fault).

    RingGPTError
    ├── ConfigError, ConfigMismatchError              ringgpt.hw.config
    ├── IllegalInstructionError                       ringgpt.hw.isa
    ├── ImageError                                    ringgpt.host.image
    ├── OutputError                                   here (a file or folder ringgpt refuses to write)
    ├── DeviceError (exit 1), the faults of any run   ringgpt.host.device (a back end's own errors: in the back end)
    ├── CompileError, CapacityError, PlanError (1)    ringgpt.host.compiler
    ├── ApplianceError, CheckError                    ringgpt.host.runtime, ringgpt.host.check
    └── the reference path's errors below
"""
from ringgpt.hw.errors import RingGPTError

__all__ = ["RingGPTError", "ModelSpecError", "CheckpointError", "DeviceUnavailableError", "TokenizerError",
           "RequestError", "PromptError", "SamplingConfigError", "GoldenRecordError", "OutputError", "InternalError"]


class InternalError(RingGPTError):
    """A fault ringgpt detected in itself (not the user's input): exit 1, please report it."""

    exit_code = 1
    label = "internal error"


class OutputError(RingGPTError):
    """A file or folder that ringgpt refuses to write (it would destroy something that is not ours) or cannot."""


class ModelSpecError(RingGPTError):
    """A model source string, synthetic model spec or dtype that cannot be understood."""


class CheckpointError(RingGPTError):
    """A checkpoint directory or weights file that is missing, corrupt, or does not match its config."""


class DeviceUnavailableError(RingGPTError):
    """A compute device that was asked for but is not present (for example CUDA without a GPU)."""


class TokenizerError(RingGPTError):
    """Tokenizer data that cannot be loaded, or token ids it cannot decode."""


class RequestError(RingGPTError):
    """A generation request that the model cannot serve (for example a hidden layer it does not have)."""


class PromptError(RequestError):
    """A prompt that is empty, too long for the model's context, or holds ids outside its vocabulary."""


class SamplingConfigError(RingGPTError):
    """A sampling parameter out of its valid range."""


class GoldenRecordError(RingGPTError):
    """A golden record file that is not one, has the wrong format version, or a result that cannot be saved as one."""
