"""The floating-point datapath in Amaranth, bit-exact with ringgpt.hw.numerics (docs/rtl-arithmetic.md)."""
