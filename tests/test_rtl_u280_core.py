"""The whole u280 core (16 x 64 MACs, a 64-wide vector unit, 32 HBM ports, 17 memories a buffer, its full buffer
depths) running the compiler's programs for a GPT-2 of 345M's width (`rtl_comparison.REAL_WIDTH_MODEL`: n_embd 1,024, 16
heads, one layer, 2,048 tokens), an 8-token prompt run and two decode runs, every logit bit-identical with the
functional simulator's (sim/rtl_comparison.py; `python scripts/rtl_u280.py` records the same run with its figures in
docs/bench/rtl_u280.json). Verilator only: the build takes 35-45 minutes and 5.8 GB on the 2-core machine (the
conversion 12-19 minutes, Verilator and its C++ at -O0 21-24), once per design (sim_build/, cached); the run 13-15
minutes (151K cycles at 170-200 cycles a second). Passes since the row-maximum fix (docs/rtl-core.md, "At u280's
size"; issue 33)."""
import numpy as np
import pytest

from ringgpt.hw.config import get_config
from ringgpt.sim.rtl_comparison import REAL_WIDTH_MODEL, logit_difference, compare_with_simulator


@pytest.mark.rtl
@pytest.mark.slow
@pytest.mark.parametrize("sim", ["verilator"], indirect=True)
def test_u280_core_generates_bit_identical_logits(sim):
    record = compare_with_simulator(get_config("u280", 1), REAL_WIDTH_MODEL, simulator=sim)
    assert record["bit_identical"], record


def test_a_comparison_says_where_the_logits_part():
    """The record of a run whose logits differ: how many, from which generated token, by how much."""
    want = np.ones((3, 4), np.float32)
    got = want.copy()
    got[1, 2] = 1.5
    assert logit_difference(got, want) == {"logits_differing": 1, "first_differing_token": 1, "max_abs_diff": 0.5,
                                            "max_rel_diff": 0.5}
    assert logit_difference(want, want)["logits_differing"] == 0
    assert logit_difference(want[:2], want)["logits_differing"] is None
