"""The root of ringgpt's one exception hierarchy, defined here (the package everything else imports) so that
the architecture config and the ISA can derive their errors from it without importing the host side.

Every error ringgpt raises on purpose is a RingGPTError whose message says what is wrong, where, and what to
do. `exit_code` is what the command line exits with when one reaches it: 2 for bad input (the default), 1 for
a failed device run or an internal fault that ringgpt detected itself.
"""


class RingGPTError(Exception):
    """Base class of every error ringgpt raises on purpose (bad input, a missing resource, a failed run)."""

    exit_code: int = 2
    """The CLI's exit status for this error: 2 = bad input, 1 = device error or internal fault."""
    label: str = "error"
    """How the CLI introduces the message."""
