"""scripts/calibrate_rtl.py: its short programs are legal and run on the cycle model, each keeping the unit of
every instruction it names busy (the RTL side is the script's own run)."""
import pytest

from ringgpt.hw.isa import OPCODES, Opcode


@pytest.fixture(scope="module")
def script(load_script):
    return load_script("calibrate_rtl")


def test_every_short_program_runs_on_the_model(script):
    for name, lines in script.SHORT.items():
        config = script.calibration_config(2 if name.startswith("ALLGATHER") else 1)
        cards = script.run_on_model(config, lines)
        assert len(cards) == config.cards
        cycles, busy = cards[-1]
        named = {OPCODES[Opcode[line.split()[0]]].unit.name.lower() for line in lines}
        for unit in named & set(busy):
            assert busy[unit] > 0, (name, unit, busy)
        assert cycles > max(busy.values()), name
