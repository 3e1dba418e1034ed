"""Shared pytest configuration: skip GPU and board tests cleanly when their hardware is absent."""
import pytest

pytest_plugins = ["ringgpt.sim.cocotb_support.pytest_plugin"]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none present)")
    for item in items:
        if "gpu" in item.keywords and not _cuda_available():
            item.add_marker(no_gpu)
