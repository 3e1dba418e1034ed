"""Errors the compiler raises for models, contexts and configurations it cannot build."""
from __future__ import annotations

from ringgpt.host.errors import RingGPTError


class CompileError(RingGPTError):
    """A model or option that the compiler cannot turn into an appliance image."""


class CapacityError(CompileError):
    """A model or context that does not fit a card's HBM or activation buffer."""
