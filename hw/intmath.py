"""Integer helpers every part of the project shares."""
from __future__ import annotations


def log2(value: int) -> int:
    """The base-2 logarithm of a power of two (of any positive int: the floor of it)."""
    return value.bit_length() - 1


def ceil_div(a, b) -> int:
    """a / b rounded up, exact for ints (and right for floats)."""
    return int(-(-a // b))
