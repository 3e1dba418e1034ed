"""sim/calibration.py (scripts/calibrate_rtl.py's programs): its short programs are legal and run on the cycle model,
each keeping the unit of every instruction it names busy (the RTL side is the script's own run)."""
from ringgpt.hw.isa import OPCODES, Opcode
from ringgpt.sim.calibration import SHORT, calibration_config, run_on_model


def test_every_short_program_runs_on_the_model():
    for name, lines in SHORT.items():
        config = calibration_config(2 if name.startswith("ALLGATHER") else 1)
        cards = run_on_model(config, lines)
        assert len(cards) == config.cards
        cycles, busy = cards[-1]
        named = {OPCODES[Opcode[line.split()[0]]].unit.name.lower() for line in lines}
        for unit in named & set(busy):
            assert busy[unit] > 0, (name, unit, busy)
        assert cycles > max(busy.values()), name
