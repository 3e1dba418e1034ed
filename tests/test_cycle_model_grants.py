"""sim/cycle_model/grants.py: the DMA engines' buffer requests and grants it replays (the cycle model's LOAD stalls,
scripts/bank_conflicts.py's counts), by hand at sim-small (4 engines, 8-word beats and chunks, 5 memories,
128-word granules)."""
import numpy as np
import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Opcode, Space
from ringgpt.hw.resolved import Resolved
from ringgpt.sim.cycle_model import instruction_cost
from ringgpt.sim.cycle_model import grants
from ringgpt.sim.cycle_model.grants import engine_beats, feed_rate, grant_cycles, grant_stall_cycles


def asks_of(cfg, *args):
    return [asks for asks, _ in engine_beats(cfg, *args)]


def test_engine_beats_merge_beats_into_rows():
    cfg = get_config("sim-small")
    # HBM words 4..19 (granule 0: engine 0) to buffer words 12..27, at the same offsets within the 8-word beat (the
    # ISA's rule for LOADs): beat 0 (words 4..7) ends chunk 1 and writes it (memory 1), beat 1 fills chunk 2
    # (memory 2), beat 2 (16..19) ends the job and writes chunk 3 (memory 3), a row a grant. A STORE beat asks
    # for the engines' one store read (bit 5), at any offsets.
    assert asks_of(cfg, 1, 16, 4, 0, 12, 0, True) == [[0b10, 0b100, 0b1000], [], [], []]
    assert asks_of(cfg, 1, 16, 0, 0, 4, 0, False) == [[0b100000, 0b100000], [], [], []]
    assert asks_of(cfg, 1, 16, 120, 0, 0, 0, False) == [[0b100000], [0b100000], [], []]
    # aligned: every beat fills its chunk; HBM words 128..135 are granule 1 (engine 1), at buffer 8..15: chunk 1
    assert asks_of(cfg, 1, 8, 128, 0, 8, 0, True) == [[], [0b10], [], []]


def test_grants_go_to_the_engines_behind_first():
    # both engines want memory 0 first; engine 1 then memory 1. Engine 0 wins cycle 2, engine 1 (behind) cycle 3,
    # then both at once in cycle 4. In engine order alone, engine 0 would win twice and the run take 5 cycles.
    assert grant_cycles([[0b1, 0b1], [0b1, 0b10]], 1.0) == 4
    assert max(grant_cycles([[0b1, 0b1]], 1.0), grant_cycles([[0b1, 0b10]], 1.0)) == 3     # each alone
    # a beat that asks for no memory is taken at once; half a beat per cycle doubles the time
    assert grant_cycles([[0, 0, 0]], 1.0) == 3
    assert grant_cycles([[0b1, 0b1]], 0.5) == 5


def test_a_loads_engines_wait_for_a_shared_memory():
    cfg = get_config("sim-small")
    assert feed_rate(cfg) == pytest.approx(0.9)   # 57.6 B/cycle of HBM over 4 ports of 16 B
    # one 8-word row from each of channels 0 and 1 (HBM words 0 and 128): to buffer chunks 0 and 1 (memories 0 and 1)
    # both rows are written in one cycle; to chunks 0 and 5 (both memory 0) engine 1 waits a cycle
    apart = Resolved(Opcode.LOAD, rows=2, n=8, dst=(Space.WBUF, 0), src1=(Space.HBM, 0), dst_stride=8,
                     src1_stride=128)
    together = apart._replace(dst_stride=40)
    assert grant_stall_cycles(apart, cfg) == 0 and grant_stall_cycles(together, cfg) == 1
    assert instruction_cost(together, cfg).cycles == instruction_cost(apart, cfg).cycles + 1
    # a STORE's beats are read one per cycle in all already; a LOAD from the host has one engine
    assert grant_stall_cycles(together._replace(op=Opcode.STORE, dst=(Space.HBM, 0),
                                                  src1=(Space.ABUF, 0)), cfg) == 0
    assert grant_stall_cycles(together._replace(src1=(Space.HOST, 0)), cfg) == 0


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_replay_is_the_definitions(seed):
    if grants._kernel() is None:
        pytest.skip("no C compiler: the definition runs instead")
    rng = np.random.default_rng(seed)
    for rate in (1.0, 0.9, 0.5, 0.81):
        engines = int(rng.integers(1, 33))
        requests = [[int(rng.choice([0, 1 << int(rng.integers(0, 6)), 1 << 17])) for _ in range(rng.integers(0, 40))]
                    for _ in range(engines)]
        jobs = [sorted(rng.integers(0, 60, len(asks)).tolist()) for asks in requests]
        assert grants.fast_grant_cycles(requests, jobs, rate) == grant_cycles(requests, rate, jobs=jobs), (seed, rate)


def test_beats_wait_for_their_jobs():
    # two engines, one beat each in memory 0: together they wait a cycle for each other; the second engine's beat
    # from job 1 (the unit issues a job a cycle) comes a cycle later anyway and waits for nothing
    assert grant_cycles([[0b1], [0b1]], 1.0) == 3
    assert grant_cycles([[0b1], [0b1]], 1.0, jobs=[[0], [1]]) == 3
    assert grant_cycles([[0b1]], 1.0, jobs=[[1]]) == 3 and grant_cycles([[0b1]], 1.0) == 2   # each alone
    # 1,024 one-row jobs (a u280 key LOAD, 8 words a row 64 apart): a row a cycle never meets another
    cfg = get_config("u280")
    keys = Resolved(Opcode.LOAD, rows=1024, n=8, dst=(Space.WBUF, 4259840), src1=(Space.HBM, 14826752),
                    dst_stride=64, src1_stride=64)
    assert grant_stall_cycles(keys, cfg) == 0
