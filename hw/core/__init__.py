"""The compute core's units (docs/rtl-core.md)."""
