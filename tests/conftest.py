"""Shared pytest configuration: skip GPU and board tests cleanly when their hardware is absent; load scripts."""
import importlib.util
from pathlib import Path

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


@pytest.fixture(scope="session")
def load_script():
    """load_script(name): the module of scripts/<name>.py (loaded once per session)."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
            loaded[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded[name])
        return loaded[name]

    return load
