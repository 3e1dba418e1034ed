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
from ringgpt.host.device import AddressFault
from ringgpt.sim.functional import SimulatorDevice, machine
from ringgpt.sim.functional import device as device_module
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


def _runs(image, cfg, monkeypatch, planned: bool = True, lockstep: bool = True) -> list:
    """Memories, stats and cycle timelines after a prompt run and four decode runs (lockstep=False: each card runs
    alone up to its router instructions, machine.run_ring without group plans, every card with an ABUF of its own)."""
    with monkeypatch.context() as patch:
        if not planned:
            patch.setattr(machine, "plan", lambda card, r: None)
        if not lockstep:
            patch.setattr(device_module, "run_ring", lambda cards, steps, groups: machine.run_ring(cards, steps))
            patch.setattr(device_module, "stacked_abuf", lambda cfg: None)
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
        assert any(run for _, run in device._groups.values()) == lockstep
        return out


def test_runs_with_plans_equal_runs_without(model, monkeypatch):
    cfg = get_config("sim-small", 2)
    image = compile_model(model, cfg, 32)
    assert _runs(image, cfg, monkeypatch, True) == _runs(image, cfg, monkeypatch, False)


@pytest.mark.parametrize("cards", [2, 3])
def test_lockstep_runs_equal_runs_card_by_card(model, monkeypatch, cards):
    """The cards in lockstep, shared vector instructions and MASKED_QK's maxima executed once over the stacked ABUF
    and ALLGATHER's blocks landing in every card's row at once (3 cards: 4 heads split unevenly, so the programs
    differ and the cards leave lockstep until the next ALLGATHER)."""
    cfg = get_config("sim-small", cards)
    image = compile_model(model, cfg, 32)
    assert _runs(image, cfg, monkeypatch, lockstep=True) == _runs(image, cfg, monkeypatch, lockstep=False)


VECTOR_PROGRAM = """
    VADD dst=ABUF[64] src1=ABUF[0] src2=ABUF[16] rows=1 n=16
    VSUB dst=ABUF[80] src1=ABUF[0] src2=ABUF[32] rows=1 n=16 +src2_row_scalar
    VMUL dst=ABUF[96] src1=ABUF[16] src2=IMM[0x3c00] rows=1 n=16
    VSCALE_SHIFT dst=ABUF[112] src1=ABUF[0] src2=ABUF[16] aux=ABUF[32] rows=1 n=16 +aux_row_scalar
    VSUM dst=ABUF[128] src1=ABUF[0] rows=1 n=16
    VDOT dst=ABUF[129] src1=ABUF[0] src2=ABUF[16] rows=1 n=16
    VDOT dst=ABUF[130] src1=ABUF[0] src2=IMM[0x4000] rows=1 n=16
    VMAX dst=ABUF[131] src1=ABUF[0] rows=1 n=16
    VEXP dst=ABUF[144] src1=ABUF[0] rows=1 n=16
    MASKED_QK dst=ABUF[160] src1=ABUF[0] src2=WBUF[0] aux=ABUF[176] rows=1 n=6 k=16 pos=r1 src2_stride=16
    VADD dst=ABUF[0] src1=ABUF[0] src2=ABUF[0] rows=1 n=16
    HALT"""


def test_group_plans_compute_each_cards_own_row():
    """Every kind of vector instruction and a MASKED_QK (its last columns masked) on 3 cards with different data, each
    executed once for all cards in lockstep: each card's results are the numerics of its own operands, run after run
    (the last instruction writes its source)."""
    rng = np.random.default_rng(11)
    device = device_for([VECTOR_PROGRAM] * 3)
    start = [rand16(rng, 48) for _ in range(3)]
    keys = [rand16(rng, 6, 16) for _ in range(3)]
    for card, words in enumerate(start):
        device.cards[card].mem[Space.ABUF][0:48] = words
        device.cards[card].mem[Space.WBUF][0:96] = keys[card].ravel()
    for run in range(3):
        device.run(3, 1)
        for card, words in enumerate(start):
            a, b, c = words[0:16], words[16:32], words[32:48]
            got = device.memory(card, Space.ABUF)
            width = CFG.vector_width
            expected = {64: nm.vadd(a, b), 80: nm.vsub(a, c[:1]), 96: nm.vmul(b, np.float16(1)),
                        112: nm.vscale_shift(a, b, c[:1]), 128: [nm.reduce_sum(a, width)],
                        129: [nm.reduce_sum(a, width, b)], 130: [nm.reduce_sum(a, width, np.float16(2))],
                        131: [nm.reduce_max(a)], 144: nm.special("exp", a), 0: nm.vadd(a, a)}
            scores = nm.matmul(a, keys[card].T, CFG.mac_width)
            scores[4:] = -np.inf
            expected.update({160: scores, 176: [nm.reduce_max(scores)]})
            for address, values in expected.items():
                values = np.asarray(values, np.float16)
                assert np.array_equal(bits(got[address:address + values.size]), bits(values)), (run, card, address)
            start[card] = got[0:48].copy()
    assert sum(run is not None for _, run in device._groups.values()) == 11


@pytest.mark.parametrize("faulty", [[0, 1], [1]])
def test_a_fault_in_lockstep_is_the_one_reported_card_by_card(faulty):
    """A shared vector instruction past ABUF's end (on both cards, or on card 1 alone) is reported as the cards
    running alone report it: the card, the pc, the operand."""
    end = CFG.abuf_words
    texts = [VECTOR_PROGRAM.replace("VEXP dst=ABUF[144]", f"VEXP dst=ABUF[{end - 8}]") if card in faulty
             else VECTOR_PROGRAM for card in range(2)]
    messages = []
    for lockstep in (True, False):
        device = device_for(texts)
        if not lockstep:
            device._groups = None
        with pytest.raises(AddressFault) as fault:
            device.run(0, 1)
        messages.append((fault.value.card, fault.value.pc, str(fault.value)))
    assert messages[0] == messages[1]
    assert messages[0][:2] == (faulty[0], 8)


def test_plans_read_memory_as_it_is_at_each_run():
    """A planned instruction sees what the host and earlier instructions wrote since its last run, weights read
    through deferred loads included (reads inside a deferred block, and after the block was written over)."""
    rng = np.random.default_rng(7)
    program = """
        LOAD dst=ABUF[0] src1=HOST[0] rows=1 n=16
        LOAD dst=WBUF[0] src1=HBM[0] rows=1 n=64
        MATMUL dst=ABUF[104] src1=ABUF[0] src2=WBUF[0] rows=1 n=4 k=16 src2_stride=16
        VMUL dst=ABUF[200] src1=ABUF[0] src2=ABUF[104] rows=1 n=4 src2_stride=4
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
        assert np.array_equal(bits(block(device, Space.ABUF, 104, 1, 4, 4)), bits(products))
        assert np.array_equal(bits(device.read_host(0, 64, 4)), bits(nm.vmul(host[:4], products[0])))
        assert bits(block(device, Space.ABUF, 300, 1, 1, 1))[0, 0] == bits(nm.reduce_sum(host, CFG.vector_width))
    assert sum(step[1] is not None and step[1] is not False for step in device.cards[0].plans.values()) >= 4
