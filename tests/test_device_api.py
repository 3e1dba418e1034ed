"""The device layering: one driver API (host/device.py: Device, the DeviceError family, the checks every back end
makes), three back ends behind it (BACKENDS: the functional simulator, the RTL simulation, the Alveo driver). Each
back end imports host/device.py and no other back end; the runtime imports no back end (it opens one by name
through open_device). Checked twice: what an import loads (in a fresh interpreter, so that nothing this test
session imported before counts) and every import statement of the sources, those inside functions included."""
import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringgpt.host.device import BACKENDS

BACKEND_PACKAGES = {name: target.partition(":")[0].rpartition(".")[0] for name, target in BACKENDS.items()}
"""The package of each back end: ringgpt.sim.functional, ringgpt.sim.rtl, ringgpt.host.alveo."""
RUNTIME = "ringgpt.host.runtime"


def test_the_back_ends_are_the_three_packages():
    assert BACKEND_PACKAGES == {"sim": "ringgpt.sim.functional", "rtl": "ringgpt.sim.rtl", "alveo": "ringgpt.host.alveo"}


def _loaded_by(modules: list[str]) -> list[str]:
    """The ringgpt modules a fresh interpreter has loaded after importing `modules`."""
    code = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('ringgpt'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _package_modules(package: str) -> list[str]:
    """`package` and every module in it, by name."""
    folder = Path(importlib.util.find_spec(package).submodule_search_locations[0])
    modules = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        modules.append(".".join((package,) + (parts[:-1] if parts[-1] == "__init__" else parts)))
    return modules


def _imports(module: str) -> set[str]:
    """Every module that `module`'s source names in an import statement (relative ones resolved)."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text(), spec.origin)
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            named.add(base)
            named.update(f"{base}.{alias.name}" for alias in node.names)  # `from package import submodule`
    return named


def test_the_runtime_and_the_alveo_driver_load_no_simulator():
    loaded = _loaded_by(_package_modules(RUNTIME) + ["ringgpt.host.alveo", "ringgpt.host.alveo.driver", "ringgpt.host.device"])
    assert "ringgpt.host.runtime.layers" in loaded and "ringgpt.host.alveo.driver" in loaded
    assert [m for m in loaded if _within(m, "ringgpt.sim")] == []


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_back_end_loads_no_other_back_end(backend):
    module = BACKENDS[backend].partition(":")[0]
    loaded = _loaded_by([module])
    assert module in loaded and "ringgpt.host.device" in loaded
    others = [package for name, package in BACKEND_PACKAGES.items() if name != backend]
    assert [m for m in loaded if any(_within(m, package) for package in others)] == []


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_no_source_of_a_back_end_imports_another(backend):
    others = [package for name, package in BACKEND_PACKAGES.items() if name != backend]
    wrong = {module: sorted(n for n in _imports(module) if any(_within(n, package) for package in others))
             for module in _package_modules(BACKEND_PACKAGES[backend])}
    assert {module: names for module, names in wrong.items() if names} == {}


def test_no_source_of_the_runtime_imports_a_back_end():
    backends = list(BACKEND_PACKAGES.values()) + ["ringgpt.sim"]
    wrong = {module: sorted(n for n in _imports(module) if any(_within(n, package) for package in backends))
             for module in _package_modules(RUNTIME)}
    assert {module: names for module, names in wrong.items() if names} == {}


def test_the_import_scan_sees_what_it_should():
    """The source scan finds the imports it is there to find (relative, inside functions, `from x import y`)."""
    assert "ringgpt.host.device" in _imports("ringgpt.sim.functional.device")
    assert "ringgpt.sim.rtl.process" in _imports("ringgpt.sim.rtl.device")          # from .process import ...
    assert "ringgpt.host.alveo.platform" in _imports("ringgpt.host.alveo.driver")   # from .platform import ...
    assert "ringgpt.host.device" in _imports("ringgpt.host.runtime.layers")
    assert "ringgpt.host.reference.sampling" in _imports("ringgpt.host.runtime.hostpath")  # inside a function
    assert "ringgpt.host.runtime.layers" in _package_modules(RUNTIME)
