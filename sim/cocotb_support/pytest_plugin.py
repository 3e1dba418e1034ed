"""pytest options and fixtures for RTL tests: `--sim verilator|icarus|all` picks the simulators
(default all; one that is not installed is skipped with the reason), `--waves` (or the environment
variable RINGGPT_WAVES=1) dumps waveforms. Tests of the whole core run on Verilator by default and on Icarus
with -m slow (`SLOW_ON_ICARUS`). A test that takes the `run_tb` fixture runs once per
selected simulator and calls run_tb(design, test_module, **args)."""
import pytest

from .runner import SIMULATORS, missing_reason, run_testbench


def pytest_addoption(parser):
    group = parser.getgroup("rtl", "RTL simulation with cocotb")
    group.addoption("--sim", choices=SIMULATORS + ("all",), default="all",
                    help="simulator(s) for RTL tests (default: all; missing ones are skipped)")
    group.addoption("--waves", action="store_true", default=False,
                    help="dump waveforms of RTL tests (same as RINGGPT_WAVES=1)")


def pytest_generate_tests(metafunc):
    own = any(mark.args[0] == "sim" for mark in metafunc.definition.iter_markers("parametrize"))
    if "sim" in metafunc.fixturenames and not own:
        choice = metafunc.config.getoption("sim")
        metafunc.parametrize("sim", SIMULATORS if choice == "all" else (choice,), indirect=True)


SLOW_ON_ICARUS = [pytest.param("icarus", marks=pytest.mark.slow), pytest.param("verilator")]
"""For `@pytest.mark.parametrize("sim", SLOW_ON_ICARUS, indirect=True)`: tests of the whole core, which Icarus
simulates 8 times slower than Verilator's model at runner.LARGE_DESIGN_CXX_OPT (180 against 1,400 ns a second for
2 cores: a 2-card generation 13 minutes against 1.7 plus a 3-minute build), run there with -m slow."""


@pytest.fixture
def sim(request) -> str:
    """The simulator of this test instance; skips when it is not installed or not selected with --sim."""
    choice = request.config.getoption("sim")
    if choice not in ("all", request.param):
        pytest.skip(f"--sim {choice}")
    reason = missing_reason(request.param)
    if reason:
        pytest.skip(reason)
    return request.param


@pytest.fixture
def run_tb(sim, request):
    """run_tb(design, test_module, **args): builds (cached) and runs a cocotb testbench on `sim`."""
    waves = request.config.getoption("waves")

    def run(design, test_module: str, **args) -> None:
        run_testbench(design, test_module, sim, args=args, waves=waves, name=request.node.name)

    return run
