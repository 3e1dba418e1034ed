"""hw/banks.py: the bank rule's hardware form (`place` on an Amaranth value, adders and tables for 2^k + 1 banks)
equals the integer rule, simulated in Amaranth on the edges of the range and on random chunk numbers."""
import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from ringgpt.hw.banks import place
from ringgpt.hw.config import get_config


@pytest.mark.parametrize("banks, bits", [(17, 26), (5, 26), (17, 9), (5, 3), (3, 7), (257, 20), (11, 12)])
def test_hardware_place_equals_the_integer_rule(banks, bits):
    m = Module()
    chunk, bank, row = Signal(bits), Signal(range(banks)), Signal(bits)
    hw_bank, hw_row = place(chunk, banks)
    m.d.comb += [bank.eq(hw_bank), row.eq(hw_row)]
    rng = random.Random(banks * 1000 + bits)
    values = sorted({0, 1, banks - 1, banks, (1 << bits) - 1, (1 << bits) - 2, *range(min(1 << bits, 300)),
                     *(rng.getrandbits(bits) for _ in range(2000))})
    wrong = []

    async def bench(ctx):
        for value in values:
            ctx.set(chunk, value)
            if (ctx.get(bank), ctx.get(row)) != place(value, banks):
                wrong.append(value)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert wrong == [], f"{len(wrong)} chunk numbers placed wrongly, first {wrong[:3]}"


def test_the_presets_banks_need_no_divider():
    # 2^k + 1 banks: 5 at sim-small, 17 at u280; 11 (8 lanes) keeps Yosys's divider, with the same numbers
    assert {name: get_config(name).buffer_banks for name in ("sim-small", "u280")} == {"sim-small": 5, "u280": 17}
    for banks, divides in ((5, False), (17, False), (11, True)):
        text = repr(place(Signal(26), banks))
        assert ("(% " in text or "(// " in text) == divides, banks
