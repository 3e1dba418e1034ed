"""sim/bank_conflicts.py (scripts/bank_conflicts.py's counts): the DMA engines' buffer requests and grants it replays,
by hand at sim-small (4 engines, 8-word beats and chunks, 5 memories, 128-word granules)."""
from ringgpt.hw.config import get_config
from ringgpt.sim.bank_conflicts import engine_requests, grant_cycles


def test_engine_requests_merge_beats_into_rows():
    cfg = get_config("sim-small")
    # HBM words 4..19 (granule 0: engine 0) to buffer words 12..27, at the same offsets within the 8-word beat (the
    # ISA's rule for LOADs): beat 0 (words 4..7) ends chunk 1 and writes it (memory 1), beat 1 fills chunk 2
    # (memory 2), beat 2 (16..19) ends the job and writes chunk 3 (memory 3), a row a grant. A STORE beat asks
    # for the engines' one store read (bit 5), at any offsets.
    assert engine_requests(cfg, 1, 16, 4, 0, 12, 0, True) == [[0b10, 0b100, 0b1000], [], [], []]
    assert engine_requests(cfg, 1, 16, 0, 0, 4, 0, False) == [[0b100000, 0b100000], [], [], []]
    assert engine_requests(cfg, 1, 16, 120, 0, 0, 0, False) == [[0b100000], [0b100000], [], []]
    # aligned: every beat fills its chunk; HBM words 128..135 are granule 1 (engine 1), at buffer 8..15: chunk 1
    assert engine_requests(cfg, 1, 8, 128, 0, 8, 0, True) == [[], [0b10], [], []]


def test_grants_go_to_the_engines_behind_first():
    # both engines want memory 0 first; engine 1 then memory 1. Engine 0 wins cycle 2, engine 1 (behind) cycle 3,
    # then both at once in cycle 4. In engine order alone, engine 0 would win twice and the run take 5 cycles.
    assert grant_cycles([[0b1, 0b1], [0b1, 0b10]], 1.0) == 4
    assert grant_cycles([[0b1, 0b1], [0b1, 0b10]], 1.0, conflicts=False) == 3
    # a beat that asks for no memory is taken at once; half a beat per cycle doubles the time
    assert grant_cycles([[0, 0, 0]], 1.0) == 3
    assert grant_cycles([[0b1, 0b1]], 0.5) == 5
