"""Whole programs on the RTL: the compiler's programs for small synthetic GPT-2 models at sim-small, a prompt
run then decode runs, on 1 core and on rings of 2 and 4 cores in one simulation (RtlDevice), FP16 and INT8
weights, with logits bit-identical to the functional simulator's; AXI memories and ring links pause at random.
Faults end with the simulator's errors. On Verilator by default, on Icarus too with -m slow (SLOW_ON_ICARUS)."""
import dataclasses

import numpy as np
import pytest

from ringgpt.host.compiler import compile_model
from ringgpt.host.device import AddressFault, CollectiveMismatchError, RingDeadlockError
from ringgpt.host.image import ApplianceImage, CardImage
from ringgpt.host.reference.models import load_model
from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.core.matrix import MatrixUnit
from ringgpt.hw.isa import Dim, Instruction, Opcode, Operand, Space
from ringgpt.hw.program import Program
from ringgpt.sim.cocotb_support.pytest_plugin import SLOW_ON_ICARUS
from ringgpt.sim.functional import SimulatorDevice
from ringgpt.sim.rtl.device import RtlDevice

from device_checks import assert_generates_like_the_simulator, program_image

CASES = {  # name: (model spec, cards, weights)
    "1 core": ("synthetic:n_layer=1,n_embd=32,n_head=2,vocab_size=64", 1, "fp16"),
    "2 cores, 3 heads": ("synthetic:n_layer=1,n_embd=48,n_head=3,vocab_size=64", 2, "fp16"),
    "2 cores, INT8 weights": ("synthetic:n_layer=1,n_embd=48,n_head=3,vocab_size=64", 2, "int8"),
    "4 cores": ("synthetic:n_layer=1,n_embd=64,n_head=4,vocab_size=64", 4, "fp16"),
}


@pytest.mark.rtl
@pytest.mark.parametrize("sim", SLOW_ON_ICARUS, indirect=True)
@pytest.mark.parametrize("case", CASES)
def test_generation_is_bit_identical_to_the_functional_simulator(case, sim):
    spec, cards, weights = CASES[case]
    config = small_config("sim-small", abuf_words=4096, wbuf_words=2048).with_cards(cards)
    image = compile_model(load_model(spec, seed=7), config, max_context=16, weights=weights)
    device = RtlDevice(image.config, simulator=sim, pause=True)
    try:
        assert_generates_like_the_simulator(image, device)
    finally:
        device.close()


def _abuf(offset: int) -> Operand:
    return Operand(Space.ABUF, 0, offset)


FAULTS = {  # name: (programs of the two cards, the DeviceError, the card and pc it names)
    "an address past ABUF": (
        [[Instruction.make(Opcode.LOAD, dst=_abuf(0), src1=_abuf(4090), rows=Dim(0, 1), n=Dim(0, 16)),
          Instruction.make(Opcode.HALT)], [Instruction.make(Opcode.HALT)]], AddressFault, 0, 0),
    "mismatched all-gathers": (
        [[Instruction.make(Opcode.ALLGATHER, dst=_abuf(0), src1=_abuf(100), rows=Dim(0, rows), n=Dim(0, 4),
                           k=Dim(0, 4 * card), dst_stride=8, src1_stride=4), Instruction.make(Opcode.HALT)]
         for card, rows in enumerate((2, 3))], CollectiveMismatchError, None, 0),
    "a RECV nothing sends": (
        [[Instruction.make(Opcode.RECV, dst=_abuf(0), rows=Dim(0, 1), n=Dim(0, 4), dst_stride=4),
          Instruction.make(Opcode.HALT)], [Instruction.make(Opcode.HALT)]], RingDeadlockError, None, 0),
}


@pytest.mark.rtl
@pytest.mark.parametrize("sim", SLOW_ON_ICARUS, indirect=True)
@pytest.mark.parametrize("fault", FAULTS)
def test_faults_end_with_a_readable_error(fault, sim):
    """A bad address, a mismatched collective and a ring that never delivers stop the run with the simulator's
    DeviceError naming where the cores stopped; nothing hangs (the cycle limit bounds the last)."""
    programs, error, card, pc = FAULTS[fault]
    config = small_config("sim-small", abuf_words=4096, wbuf_words=2048).with_cards(2)
    device = RtlDevice(config, simulator=sim, pause=True, cycle_limit=5000)
    try:
        device.load(program_image(config, programs))
        with pytest.raises(error) as caught:
            device.run(0, 1)
    finally:
        device.close()
    if card is not None:
        assert (caught.value.card, caught.value.pc) == (card, pc)
    else:
        assert any(pc == stopped_pc for _, stopped_pc, _, _ in caught.value.cards)


def _hazard_program(config) -> list:
    """A NOP first (the value the controller's head register holds before the first word: a run used to stall on it
    under Icarus), then pairs of instructions on different units where the second must wait for the first (RAW, WAR,
    WAW through ABUF, WBUF, HBM and the host buffer), then ABUF's first 1,024 words stored to the host buffer."""
    def space(kind, offset):
        return Operand(kind, 0, offset)
    a, w, h, host = (lambda o, s=s: space(s, o) for s in (Space.ABUF, Space.WBUF, Space.HBM, Space.HOST))
    row = {"rows": Dim(0, 1)}
    make = Instruction.make
    return [
        make(Opcode.NOP),
        make(Opcode.LOAD, dst=a(0), src1=h(0), n=Dim(0, 64), **row),                        # RAW DMA -> vector
        make(Opcode.VADD, dst=a(104), src1=a(0), src2=a(0), n=Dim(0, 64), **row),
        make(Opcode.LOAD, dst=w(0), src1=h(64), rows=Dim(0, 8), n=Dim(0, 64), src1_stride=64, dst_stride=64),
        make(Opcode.VMUL, dst=a(200), src1=a(104), src2=Operand(Space.IMM, 0, 0x3800), n=Dim(0, 64), **row),
        make(Opcode.MATMUL, dst=a(400), src1=a(200), src2=w(0), n=Dim(0, 8), k=Dim(0, 64), **row,
             src2_stride=64),                                                                 # RAW vector, DMA -> matrix
        make(Opcode.LOAD, dst=a(200), src1=h(1024), n=Dim(0, 64), **row),                   # WAR matrix -> DMA
        make(Opcode.VADD, dst=a(300), src1=a(400), src2=a(200), n=Dim(0, 8), **row),       # RAW matrix, DMA -> vector
        make(Opcode.LOAD, dst=a(300), src1=h(2052), n=Dim(0, 4), **row),                    # WAW vector -> DMA
        make(Opcode.STORE, dst=h(3000), src1=a(104), n=Dim(0, 64), **row),                  # RAW through HBM
        make(Opcode.LOAD, dst=a(504), src1=h(3000), n=Dim(0, 64), **row),
        make(Opcode.STORE, dst=host(1024), src1=a(504), n=Dim(0, 32), **row),               # RAW through HOST
        make(Opcode.LOAD, dst=a(600), src1=host(1024), n=Dim(0, 32), **row),
        make(Opcode.VSUB, dst=a(600), src1=a(600), src2=a(0), n=Dim(0, 32), **row),
        make(Opcode.STORE, dst=host(0), src1=a(0), n=Dim(0, 1024), **row),
        make(Opcode.HALT),
    ]


@pytest.mark.rtl
@pytest.mark.parametrize("sim", SLOW_ON_ICARUS, indirect=True)
def test_hazards_across_units_give_the_simulators_result(sim):
    """Each dependent pair above would read or leave other data if the scoreboard let the second start early;
    with random AXI pauses the core's host buffer equals the functional simulator's."""
    config = small_config("sim-small", abuf_words=4096, wbuf_words=2048).with_cards(1)
    rng = np.random.default_rng(5)
    hbm = (rng.standard_normal(4096) * 0.5).astype(np.float16)
    golden, rtl = _host_words_after(config, _hazard_program(config), hbm, 2048,
                                    RtlDevice(config, simulator=sim, pause=True, cycle_limit=50000))
    np.testing.assert_array_equal(rtl, golden)


def _host_words_after(config, program: list, hbm: np.ndarray, words: int, rtl: RtlDevice) -> list:
    """The first `words` words of the host buffer after one run of `program` on one card (HBM from word 0: `hbm`),
    on the functional simulator and on `rtl`."""
    image = ApplianceImage(config, [CardImage(Program(program, config.name, config.hash, 0, 1),
                                              hbm_segments=[(0, hbm)], hbm_words=4096, host_words=words)])
    results = []
    for device in (SimulatorDevice(config), rtl):
        try:
            device.load(image)
            device.run(0, 1)
            results.append(device.read_host(0, 0, words).view(np.uint16))
        finally:
            device.close()
    return results


def _row_max_program() -> list:
    """A MATMUL, then a MASKED_QK of 2 keys and another MATMUL on the same unit, their operands loaded first so that
    each waits in the unit's queue and is taken as the one before is done; the results and the MASKED_QK's row maximum
    stored to the host."""
    a, w, h, host = (lambda o, s=s: Operand(s, 0, o) for s in (Space.ABUF, Space.WBUF, Space.HBM, Space.HOST))
    row = {"rows": Dim(0, 1)}
    make = Instruction.make
    return [
        make(Opcode.LOAD, dst=w(2048 - 32), src1=h(512), rows=Dim(0, 2), n=Dim(0, 16), src1_stride=16, dst_stride=16),
        make(Opcode.LOAD, dst=a(0), src1=h(0), n=Dim(0, 64), **row),
        make(Opcode.LOAD, dst=w(0), src1=h(64), rows=Dim(0, 16), n=Dim(0, 64), src1_stride=64, dst_stride=64),
        make(Opcode.MATMUL, dst=a(100), src1=a(0), src2=w(0), n=Dim(0, 16), k=Dim(0, 64), src2_stride=64, **row),
        make(Opcode.MASKED_QK, dst=a(200), src1=a(0), src2=w(2048 - 32), n=Dim(0, 2), k=Dim(0, 16), src2_stride=16,
             aux=a(300), pos=Dim(0, 1), aux_stride=1, **row),
        make(Opcode.MATMUL, dst=a(400), src1=a(0), src2=w(0), n=Dim(0, 16), k=Dim(0, 64), src2_stride=64, **row),
        make(Opcode.STORE, dst=host(0), src1=a(0), n=Dim(0, 512), **row),
        make(Opcode.HALT),
    ]


@pytest.mark.rtl
@pytest.mark.parametrize("sim", SLOW_ON_ICARUS, indirect=True)
def test_a_row_maximum_is_its_own_instructions(sim):
    """Regression (found at u280 width, issue 33): the matrix unit's row maximum leaves its max tree
    row_max_latency cycles after the result's write, and a MATMUL is done at its last write; with 16 lanes (4 levels)
    the MATMUL's last maximum reached the tree's end as the next instruction, a MASKED_QK, was checked, and was
    written and counted as the MASKED_QK's own (the decode runs' softmax then subtracted the wrong maximum: logits
    one FP16 step off). A core of 16 lanes x 16 MACs, a MATMUL with outputs far above the scores."""
    config = dataclasses.replace(small_config("sim-small", abuf_words=4096, wbuf_words=2048), mpu_lanes=16,
                                 mac_width=16, vector_width=16).with_cards(1)
    assert MatrixUnit(config).row_max_latency == 4
    rng = np.random.default_rng(9)
    hbm = (rng.standard_normal(2048) * 0.25).astype(np.float16)
    hbm[64:64 + 1024] *= 16                                  # the MATMUL's weights: its row maximum far above the scores
    golden, rtl = _host_words_after(config, _row_max_program(), hbm, 512,
                                    RtlDevice(config, simulator=sim, cycle_limit=20000))
    np.testing.assert_array_equal(rtl[300], golden[300])      # the row maximum
    np.testing.assert_array_equal(rtl, golden)
