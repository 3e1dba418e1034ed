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

from ringgpt.host.device import (AddressFault, AlignmentFault, CollectiveMismatchError, IllegalInstructionFault,
                                 RingDeadlockError)
from ringgpt.hw.assembly import assemble
from ringgpt.hw.config import get_config
from ringgpt.sim.functional import SimulatorDevice
from ringgpt.sim.rtl.device import RtlDevice
from ringgpt.sim.rtl_comparison import REAL_WIDTH_MODEL, logit_difference, compare_with_simulator

from device_checks import program_image


@pytest.mark.rtl
@pytest.mark.slow
@pytest.mark.parametrize("sim", ["verilator"], indirect=True)
def test_u280_core_generates_bit_identical_logits(sim):
    record = compare_with_simulator(get_config("u280", 1), REAL_WIDTH_MODEL, simulator=sim)
    assert record["bit_identical"], record


U280_FAULTS = {  # name: (the word at pc 0 of a one-card program, the DeviceError both back ends raise)
    "an illegal word": (0x3F, IllegalInstructionFault),                  # opcode 0x3f does not exist
    "an address past ABUF": ("LOAD dst=ABUF[0] src1=ABUF[{abuf_end}] rows=1 n=64", AddressFault),
    "an address past HBM": ("LOAD dst=ABUF[0] src1=HBM[4294967264] rows=1 n=64", AddressFault),
    "a vector operand off its boundary": ("VADD dst=ABUF[0] src1=ABUF[32] src2=IMM[0x3c00] rows=1 n=64",
                                          AlignmentFault),
    "weights off their boundary": ("MATMUL dst=ABUF[0] src1=ABUF[0] src2=WBUF[32] rows=1 n=16 k=64 src2_stride=64",
                                   AlignmentFault),
    "words shifted within the beat": ("LOAD dst=ABUF[16] src1=HBM[0] rows=1 n=64", AlignmentFault),
}


@pytest.mark.rtl
@pytest.mark.slow
@pytest.mark.parametrize("sim", ["verilator"], indirect=True)
def test_u280_core_faults_end_with_the_simulators_error(sim):
    """Bad words on the whole u280 core (the build of the test above, pause off): an illegal word (both back ends
    refuse the image at load, as every back end checks it), an address past ABUF or past HBM (the card's 2^32
    words), a vector operand, matrix weights or an HBM LOAD's words off their boundaries (32 words in: a multiple
    of the 32-word beat and of sim-small's 8, not of u280's 64-word vector_align and weight_align, so only the u280
    rule catches the first two; the beat's 16 in the last) each stop the run with the functional simulator's
    DeviceError subclass naming card 0, pc 0. About 30 seconds once built."""
    config = get_config("u280", 1)

    def words(line):
        if isinstance(line, int):
            return [line, *(inst.encode() for inst in assemble("HALT"))]
        return assemble(line.format(abuf_end=config.abuf_words - 32) + "\nHALT")
    cases = {name: (program_image(config, [words(line)]), error) for name, (line, error) in U280_FAULTS.items()}
    wrong = _outcomes_otherwise(config, RtlDevice(config, simulator=sim), cases,
                                lambda caught: (caught.card, caught.pc) == (0, 0))
    assert not wrong, wrong


def _outcomes_otherwise(config, device, cases: dict, named) -> list:
    """Each case (name: (image, DeviceError class)) loaded and run (pos 0, one row) on the functional simulator and
    on the RTL `device` (closed after): what went otherwise than that error, with `named(error)` true."""
    wrong = []
    try:
        for name, (image, error) in cases.items():
            for label, back_end in (("functional simulator", SimulatorDevice(config)), ("RTL", device)):
                try:
                    back_end.load(image)
                    back_end.run(0, 1)
                    wrong.append(f"{name}: the {label} ran it")
                except error as caught:
                    if not named(caught):
                        wrong.append(f"{name}: the {label} names {caught}")
    finally:
        device.close()
    return wrong


def _ring_faults() -> dict:
    """name: (the two cards' programs, the DeviceError): all-gathers of 2 and 3 rows, and a RECV nothing sends."""
    gather = "ALLGATHER dst=ABUF[0] src1=ABUF[{k}] rows={rows} n=64 k={k} dst_stride=128 src1_stride=128"
    return {"mismatched all-gathers": ([assemble(gather.format(k=64 * card, rows=rows) + "\nHALT")
                                        for card, rows in enumerate((2, 3))], CollectiveMismatchError),
            "a RECV nothing sends": ([assemble("RECV dst=ABUF[0] rows=1 n=64 dst_stride=64\nHALT"), assemble("HALT")],
                                     RingDeadlockError)}


@pytest.mark.rtl
@pytest.mark.slow
@pytest.mark.parametrize("sim", ["verilator"], indirect=True)
def test_u280_ring_faults_end_with_the_simulators_error(sim):
    """On a ring of two whole u280 cores (the build of `python scripts/rtl_u280.py --cards 2`, pause off), mismatched
    all-gathers and a RECV that nothing sends end with the functional simulator's DeviceError subclass, the
    second at the cycle limit (a ring that never delivers), naming card 0 not halted and card 1 halted, the first
    a card at its ALLGATHER (pc 0). The simulator names card 0 at its RECV (pc 0); the RTL at its controller's pc,
    the HALT that waits for the RECV (pc 1): the pc register holds the next word to decide. About a minute once
    built."""
    config = get_config("u280", 2)

    def named(caught) -> bool:
        states = {card: (pc, state) for card, pc, _, state in caught.cards}
        if isinstance(caught, RingDeadlockError):
            return (states.get(0, (None, "halted"))[0] in (0, 1) and states[0][1] != "halted"
                    and states.get(1, (None, None))[1] == "halted")
        return any(pc == 0 for pc, _ in states.values())    # the card that saw the other's header, at its ALLGATHER
    cases = {name: (program_image(config, programs), error) for name, (programs, error) in _ring_faults().items()}
    wrong = _outcomes_otherwise(config, RtlDevice(config, simulator=sim, cycle_limit=5000), cases, named)
    assert not wrong, wrong


def test_a_comparison_says_where_the_logits_part():
    """The record of a run whose logits differ: how many, from which generated token, by how much."""
    want = np.ones((3, 4), np.float32)
    got = want.copy()
    got[1, 2] = 1.5
    assert logit_difference(got, want) == {"logits_differing": 1, "first_differing_token": 1, "max_abs_diff": 0.5,
                                            "max_rel_diff": 0.5}
    assert logit_difference(want, want)["logits_differing"] == 0
    assert logit_difference(want[:2], want)["logits_differing"] is None
