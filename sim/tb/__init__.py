"""cocotb testbenches, one per hardware unit, run from tests/test_rtl_*.py."""
