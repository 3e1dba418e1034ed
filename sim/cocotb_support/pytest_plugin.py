"""pytest options and fixtures for RTL tests: `--sim verilator|icarus|all` picks the simulators
(default all; one that is not installed is skipped with the reason), `--waves` (or the environment
variable RINGGPT_WAVES=1) dumps waveforms. A test that takes the `run_tb` fixture runs once per
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
    if "sim" in metafunc.fixturenames:
        choice = metafunc.config.getoption("sim")
        metafunc.parametrize("sim", SIMULATORS if choice == "all" else (choice,), indirect=True)


@pytest.fixture
def sim(request) -> str:
    """The simulator of this test instance; skips when it is not installed."""
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
