"""The functional simulator's plans (sim/functional/plans.py) change no result: a stored digest of a multi-card
generation's logits, every memory and cycle report with plans against without, and plans over memory that changes
between runs (the host buffer, deferred weight loads)."""
import hashlib

import numpy as np
import pytest
import torch

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.models import load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import Appliance
from ringgpt.hw import numerics as nm
from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Space
from ringgpt.sim.functional import SimulatorDevice, machine
from test_functional_sim import CFG, bits, block, device_for, rand16

MODEL = "synthetic:n_layer=2,n_embd=64,n_head=4,vocab_size=300,n_positions=64"
LOGITS_SHA256 = "c3c6bd066097331338ed76d800313d3aedf6a176fc3fb4ef987b75185f72e772"
"""The float32 logits of generate([5, 17, 250, 3, 99], 6 greedy tokens) of MODEL on sim-small, 1 or 3 cards, as
the simulator computed them before plans (and the same on either card count)."""


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL, dtype=torch.float32)


@pytest.mark.parametrize("cards", [1, 3])
def test_generation_logits_are_bit_identical_to_the_stored_digest(model, cards):
    cfg = get_config("sim-small", cards)
    appliance = Appliance(SimulatorDevice(cfg), compile_model(model, cfg, 32))
    result = appliance.generate([5, 17, 250, 3, 99], SamplingConfig(max_new_tokens=6, stop_at_eos=False))
    logits = np.ascontiguousarray(result.logits, np.float32)
    assert logits.shape == (6, 300)
    assert hashlib.sha256(logits.tobytes()).hexdigest() == LOGITS_SHA256


def _runs(image, cfg, monkeypatch, planned: bool) -> list:
    """Memories, stats and cycle timelines after a prompt run and four decode runs."""
    with monkeypatch.context() as patch:
        if not planned:
            patch.setattr(machine, "plan", lambda card, r: None)
        device = SimulatorDevice(cfg)
        device.load(image)
        offset = image.meta["host"]["ids_offset"]
        out = []
        for pos, rows in [(0, 4), (4, 1), (5, 1), (6, 1), (7, 1)]:
            for card in range(cfg.cards):
                device.write_host(card, offset, np.arange(7 * pos + 1, 7 * pos + 1 + rows, dtype=np.uint16))
            stats = device.run(pos, rows)
            memories = [bits(device.memory(c, s)).tobytes() for c in range(cfg.cards)
                        for s in (Space.ABUF, Space.WBUF, Space.HBM, Space.HOST)]
            out.append((memories, stats.cycles, stats.hbm_bytes, [c.timeline for c in device.last_report.cards]))
        if planned:
            assert any(step[1] for card in device.cards for step in card.plans.values())
        return out


def test_runs_with_plans_equal_runs_without(model, monkeypatch):
    cfg = get_config("sim-small", 2)
    image = compile_model(model, cfg, 32)
    assert _runs(image, cfg, monkeypatch, True) == _runs(image, cfg, monkeypatch, False)


def test_plans_read_memory_as_it_is_at_each_run():
    """A planned instruction sees what the host and earlier instructions wrote since its last run, weights read
    through deferred loads included (reads inside a deferred block, and after the block was written over)."""
    rng = np.random.default_rng(7)
    program = """
        LOAD dst=ABUF[0] src1=HOST[0] rows=1 n=16
        LOAD dst=WBUF[0] src1=HBM[0] rows=1 n=64
        MATMUL dst=ABUF[100] src1=ABUF[0] src2=WBUF[0] rows=1 n=4 k=16 src2_stride=16
        VMUL dst=ABUF[200] src1=ABUF[0] src2=ABUF[100] rows=1 n=4 src2_stride=4
        VSUM dst=ABUF[300] src1=ABUF[0] rows=1 n=16
        STORE dst=HOST[64] src1=ABUF[200] rows=1 n=4
        HALT"""
    hbm = rand16(rng, 64)
    device = device_for(program, hbm=[(0, 0, hbm)])
    for run in range(4):
        host = rand16(rng, 16)
        device.write_host(0, 0, host)
        if run == 2:  # the weights' WBUF words written over: the next run's LOAD defers them again
            device.cards[0].mem[Space.WBUF][0:64] = 0
        device.run(0, 1)
        products = nm.matmul(host[None, :], hbm.reshape(4, 16).T, CFG.mac_width)
        assert np.array_equal(bits(block(device, Space.ABUF, 100, 1, 4, 4)), bits(products))
        assert np.array_equal(bits(device.read_host(0, 64, 4)), bits(nm.vmul(host[:4], products[0])))
        assert bits(block(device, Space.ABUF, 300, 1, 1, 1))[0, 0] == bits(nm.reduce_sum(host, CFG.vector_width))
    assert sum(step[1] is not None and step[1] is not False for step in device.cards[0].plans.values()) >= 4
