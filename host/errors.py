"""The project's exception hierarchy: every error a user can cause is a RingGPTError with a message that says what
is wrong and how to fix it (the CLI prints it as one line and exits 2)."""


class RingGPTError(Exception):
    """Base class of all ringgpt errors caused by bad input or a missing resource."""


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
