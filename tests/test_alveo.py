"""The Alveo driver (host/alveo): AlveoDevice's own code against platforms of kernels.

Fast tests use a platform in Python whose kernels execute what the driver placed in their buffers on the
functional simulator: programs decoded from the program buffer, HBM gathered from the channel buffers through
hw/hbm.py's map, host words from the host buffer, each found by the address in its pointer register; generation
through it must equal the functional simulator's, and the register writes must be registers.py's. Scripted
kernels give the error paths: an error code maps to the simulator's DeviceError naming card, pc and
instruction; a kernel that never finishes times out naming the cards still running. Manifests of another config,
register map or xclbin are refused; without PYNQ or boards the device fails at once with one line.
PynqPlatform runs against a stand-in of PYNQ's API (the one used on boards, marked `board`, skips without them).

Marked rtl: the same driver on the kernels' RTL (SimKernelPlatform) on 1 and 2 cards, tokens and logits
bit-identical to the functional simulator; then, in the same simulation, an address fault and a kernel that never
finishes. On Icarus by default, on Verilator with -m slow (its build of the whole kernel is long).
"""
from __future__ import annotations

import hashlib
import json
import sys
import types

import numpy as np
import pytest
from click.testing import CliRunner

from ringgpt.host import cli
from ringgpt.host.alveo import (AlveoDevice, AlveoUnavailableError, PynqPlatform, RunTimeoutError, check_boards,
                                check_manifest)
from ringgpt.host.compiler import compile_model
from ringgpt.host.device import (AddressFault, CollectiveMismatchError, HostAccessError, IllegalInstructionFault,
                                 NotLoadedError, SimulatorError, open_device)
from ringgpt.host.image import ApplianceImage
from ringgpt.host.reference.models import load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.hw import hbm
from ringgpt.hw.config import ConfigMismatchError, get_config
from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.isa import INSTRUCTION_BYTES, Dim, Instruction, Opcode, Operand, Space, decode
from ringgpt.hw.program import Program
from ringgpt.hw.kernel import registers
from ringgpt.hw.kernel.registers import AP_DONE, AP_IDLE, AP_START, CONTROL
from ringgpt.hw.kernel.vitis import DEFAULT_PLATFORM
from ringgpt.hw.resolved import Decoded
from ringgpt.sim.cocotb_support.bench import CLOCK_PERIOD_NS
from ringgpt.sim.cocotb_support.pytest_plugin import SLOW_ON_ICARUS
from ringgpt.sim.cocotb_support.runner import ROOT
from ringgpt.sim.functional import SimulatorDevice
from ringgpt.sim.functional.machine import Card, run_ring

from device_checks import assert_generates_like_the_simulator, program_image

RTL_SAMPLING = SamplingConfig(max_new_tokens=2, stop_at_eos=False)
"""On the RTL: the prompt run and one decode run (a few thousand cycles each)."""
MODELS = {1: "synthetic:n_layer=1,n_embd=32,n_head=2,vocab_size=64",
          2: "synthetic:n_layer=1,n_embd=48,n_head=3,vocab_size=64",
          4: "synthetic:n_layer=1,n_embd=64,n_head=4,vocab_size=64"}
"""Per card count, the model generated with (2 cards: 3 heads, split unevenly)."""


def small(cards: int):
    return small_config("sim-small", abuf_words=4096, wbuf_words=2048).with_cards(cards)


def compiled(cards: int) -> ApplianceImage:
    return compile_model(load_model(MODELS[cards], seed=7), small(cards), max_context=16)


# --- a platform in Python -----------------------------------------------------------------------------------
class FakeBuffer:
    """`array` on the host; `device` the card's copy, which only the syncs update."""

    def __init__(self, card, nbytes: int, argument: str, address: int):
        self.card, self.argument, self.device_address = card, argument, address
        self.array = np.full(nbytes, 0xA5, np.uint8)   # not zero: the driver must clear what it uses
        self.device = np.full(nbytes, 0x5A, np.uint8)
        self.freed = False

    def sync_to_device(self, offset: int, nbytes: int) -> None:
        self.device[offset:offset + nbytes] = self.array[offset:offset + nbytes]

    def sync_from_device(self, offset: int, nbytes: int) -> None:
        self.array[offset:offset + nbytes] = self.device[offset:offset + nbytes]

    def free(self) -> None:
        self.freed = True


class FakeKernel:
    """A kernel's register file with ap_ctrl_hs behaviour; what a run does is the platform's `execute`."""

    def __init__(self, platform, index: int):
        self.platform, self.index = platform, index
        self.words: dict[int, int] = {}
        self.writes: list[tuple[int, int]] = []
        self.running = self.done = False
        self.status = {"error": 0, "error_pc": 0, "pc": 0, "cycles": 0}
        self.buffers: list[FakeBuffer] = []

    def read(self, offset: int) -> int:
        regs = registers.by_name(self.platform.cfg)
        if offset == CONTROL:
            value = (0 if self.running else AP_IDLE) | (AP_DONE if self.done else 0)
            self.done = False
            return value
        names = {reg.offset: name for name, reg in regs.items() if reg.kind == "status"}
        if offset in names:
            return self.status.get(names[offset], 7)
        return self.words.get(offset, 0)

    def write(self, offset: int, value: int) -> None:
        assert 0 <= value < 1 << 32
        self.writes.append((offset, value))
        if offset == CONTROL and value & AP_START:
            self.running = True
            if all(kernel.running for kernel in self.platform.cards):
                self.platform.execute()
        else:
            self.words[offset] = value

    def allocate(self, nbytes: int, argument: str) -> FakeBuffer:
        base = (5 << 32) + (registers.master_ports(self.platform.cfg).index(
            registers.by_name(self.platform.cfg)[argument].port) << 28)
        buffer = FakeBuffer(self, nbytes, argument, base + sum(b.array.size for b in self.buffers
                                                                 if b.argument == argument))
        self.buffers.append(buffer)
        return buffer

    def pointer(self, name: str) -> FakeBuffer:
        """The live buffer whose address the pointer register `name` holds."""
        reg = registers.by_name(self.platform.cfg)[name]
        address = self.words[reg.offset] | self.words[reg.offset + 4] << 32
        (buffer,) = [b for b in self.buffers if b.device_address == address and not b.freed]
        return buffer

    def finish(self, error: int = 0, pc: int = 0) -> None:
        self.running, self.done = False, True
        self.status.update(error=error, error_pc=pc, pc=pc, cycles=100 + self.index)


class FakePlatform:
    """Kernels that run the functional simulator on their buffers (or `script(platform)` instead)."""

    description = "fake kernels"
    default_timeout_s = 1.0

    def __init__(self, cfg, image: ApplianceImage | None = None, script=None):
        self.cfg, self.script, self.time, self.closed = cfg, script, 0.0, False
        self.cards = [FakeKernel(self, index) for index in range(cfg.cards)]
        self.machines = [Card(index, cfg, [], card.hbm_words, card.host_words)
                         for index, card in enumerate(image.cards)] if image else []

    def now(self) -> float:
        return self.time

    def sleep(self, seconds: float) -> None:
        self.time += seconds

    def close(self) -> None:
        self.closed = True

    def execute(self) -> None:
        if self.script:
            return self.script(self)
        regs = registers.by_name(self.cfg)
        for kernel, machine in zip(self.cards, self.machines):
            code = kernel.pointer("program").device
            machine.program = []
            while not machine.program or machine.program[-1].op is not Opcode.HALT:
                word = code[len(machine.program) * INSTRUCTION_BYTES:][:INSTRUCTION_BYTES]
                machine.program.append(Decoded(decode(int.from_bytes(word.tobytes(), "little"))))
            for channel in range(self.cfg.hbm_channels):
                words = kernel.pointer(registers.hbm_port(channel)).device.view(np.float16)
                local = np.arange(hbm.local_range(channel, 0, machine.mem[Space.HBM].size, self.cfg)[1])
                machine.mem[Space.HBM][hbm.hbm_word(channel, local, self.cfg)] = words[local]
            host = machine.mem[Space.HOST]
            host[:] = kernel.pointer("host").device.view(np.float16)[:host.size]
            assert (kernel.words[regs["card_id"].offset], kernel.words[regs["cards"].offset]) == (
                kernel.index, self.cfg.cards)
            machine.start(kernel.words[regs["pos"].offset], kernel.words[regs["rows"].offset])
        run_ring(self.machines, 1 << 20)
        for kernel, machine in zip(self.cards, self.machines):
            for channel in range(self.cfg.hbm_channels):
                words = kernel.pointer(registers.hbm_port(channel)).device.view(np.float16)
                local = np.arange(hbm.local_range(channel, 0, machine.mem[Space.HBM].size, self.cfg)[1])
                words[local] = machine.mem[Space.HBM][hbm.hbm_word(channel, local, self.cfg)]
            kernel.pointer("host").device.view(np.float16)[:machine.mem[Space.HOST].size] = machine.mem[Space.HOST]
            kernel.finish()


@pytest.mark.parametrize("cards", [1, 2])
def test_generation_through_the_driver_equals_the_functional_simulator(cards):
    """The driver's buffers, channel map, program words and pointers are what a kernel needs to compute the
    simulator's tokens and logits (ABUF and WBUF persist across runs in the fake kernels, as on a board)."""
    image = compiled(cards)
    platform = FakePlatform(image.config, image)
    device = open_device("alveo", image.config, platform=platform)
    assert_generates_like_the_simulator(image, device)
    buffers = [b for kernel in platform.cards for b in kernel.buffers]
    device.close()
    assert platform.closed and all(b.freed for b in buffers)


def _image(config, programs: list, host_words: int = 64) -> ApplianceImage:
    """program_image with a random HBM segment at word 17 on every card."""
    segment = np.random.default_rng(3).standard_normal(3000).astype(np.float16)
    return program_image(config, programs, host_words, [(17, segment)])


def _store(n: int, src: int = 0) -> list:
    """HBM words [src, src + n) through ABUF words [src, src + n) (the same offsets within the beat, as an off-chip
    LOAD keeps them) to host words [0, n), then HALT."""
    return [Instruction.make(Opcode.LOAD, dst=Operand(Space.ABUF, 0, src), src1=Operand(Space.HBM, 0, src),
                             rows=Dim(0, 1), n=Dim(0, n)),
            Instruction.make(Opcode.STORE, dst=Operand(Space.HOST, 0, 0), src1=Operand(Space.ABUF, 0, src),
                             rows=Dim(0, 1), n=Dim(0, n)),
            Instruction.make(Opcode.HALT)]


def test_registers_written_are_the_register_maps():
    """load writes card_id, cards and every pointer (low word, then high word: the fake's addresses lie above
    4 GiB) of registers.py; run writes pos and rows on every card before the first ap_start."""
    config = small(2)
    platform = FakePlatform(config, _image(config, [_store(64)] * 2))
    device = AlveoDevice(config, platform=platform)
    device.load(_image(config, [_store(64)] * 2))
    regs = registers.by_name(config)
    for index, kernel in enumerate(platform.cards):
        expected = {regs["card_id"].offset: index, regs["cards"].offset: 2}
        for buffer in kernel.buffers:
            reg = regs[buffer.argument]
            address = buffer.device_address
            expected.update({reg.offset: address & 0xFFFFFFFF, reg.offset + 4: address >> 32})
        assert dict(kernel.writes) == expected and len(kernel.writes) == len(expected)
        assert sorted(b.argument for b in kernel.buffers) == sorted(
            r.name for r in registers.register_map(config) if r.kind == "pointer")
        kernel.writes.clear()
    device.run(3, 1)
    starts = [kernel.writes.index((CONTROL, AP_START)) for kernel in platform.cards]
    for kernel, start in zip(platform.cards, starts):
        assert kernel.writes[:2] == [(regs["pos"].offset, 3), (regs["rows"].offset, 1)] and start == 2
    segment = _image(config, [_store(64)] * 2).cards[1].hbm_segments[0][1]
    np.testing.assert_array_equal(device.read_host(1, 0, 64), np.concatenate([np.zeros(17, np.float16), segment[:47]]))


def test_load_programs_replaces_the_programs_and_keeps_the_memories():
    """A longer program gets a new buffer and the kernel its address; HBM and host buffers stay as they are."""
    config = small(1)
    image = _image(config, [_store(16)])
    results = []
    for device in (SimulatorDevice(config), AlveoDevice(config, platform=FakePlatform(config, image))):
        device.load(image)
        device.run(0, 1)
        longer = [Instruction.make(Opcode.NOP)] * 100 + _store(32, src=100)
        device.load_programs([Program(longer, config.name, config.hash, 0, 1)])
        device.run(0, 1)
        results.append(device.read_host(0, 0, 64).view(np.uint16))
        device.close()
    np.testing.assert_array_equal(results[1], results[0])


def _scripted(config, outcomes: dict):
    """A platform whose kernels finish with outcomes[card] = (error code, pc), or never when it is None."""
    def script(platform):
        for kernel in platform.cards:
            outcome = outcomes.get(kernel.index, (0, 2))
            if outcome is not None:
                kernel.finish(*outcome)
            else:
                kernel.status["pc"] = 1
    return FakePlatform(config, script=script)


@pytest.mark.parametrize("code, error", [(ErrorCode.OUT_OF_RANGE, AddressFault), (ErrorCode.BUS, AddressFault),
                                         (ErrorCode.ILLEGAL, IllegalInstructionFault),
                                         (ErrorCode.RING, CollectiveMismatchError),
                                         (ErrorCode.BAD_SPACE, SimulatorError)])
def test_an_error_code_becomes_the_simulators_error_naming_card_pc_and_instruction(code, error):
    config = small(2)
    device = AlveoDevice(config, platform=_scripted(config, {1: (code.value, 1)}))
    device.load(_image(config, [_store(8)] * 2))
    with pytest.raises(error) as caught:
        device.run(0, 1)
    text = str(caught.value)
    assert "card 1" in text and "STORE" in text and code.name in text
    assert device.status().last_error == text


def test_an_unknown_error_code_is_reported_as_such():
    config = small(1)
    device = AlveoDevice(config, platform=_scripted(config, {0: (15, 0)}))
    device.load(_image(config, [_store(8)]))
    with pytest.raises(Exception, match="error code 15"):
        device.run(0, 1)


def test_a_kernel_that_never_finishes_times_out_naming_the_cards_still_running():
    """The timeout runs on the platform's clock; the card left running is refused until reset."""
    config = small(2)
    platform = _scripted(config, {0: None})
    device = AlveoDevice(config, platform=platform, timeout_s=0.01)
    device.load(_image(config, [_store(8)] * 2))
    with pytest.raises(RunTimeoutError) as caught:
        device.run(0, 1)
    (card, pc, text, state), *others = caught.value.cards
    assert (card, pc, state) == (0, 1, "still running") and text.startswith("STORE")
    assert [state for *_, state in others] == ["done"]
    assert 0.01 <= platform.time < 0.011 and "xbutil reset" in str(caught.value)
    with pytest.raises(Exception, match="card 0 is still running an earlier run"):
        device.run(0, 1)


def test_host_access_is_checked():
    config = small(1)
    device = AlveoDevice(config, platform=FakePlatform(config))
    with pytest.raises(NotLoadedError):
        device.read_host(0, 0, 1)
    device.load(_image(config, [_store(8)]))
    with pytest.raises(HostAccessError):
        device.read_host(0, 60, 8)
    with pytest.raises(HostAccessError):
        device.write_host(1, 0, np.zeros(1, np.float16))
    device.write_host(0, 3, np.arange(4).astype(np.float16))
    np.testing.assert_array_equal(device.read_host(0, 2, 6), np.float16([0, 0, 1, 2, 3, 0]))


# --- manifests ---------------------------------------------------------------------------------------------
def _manifest(tmp_path, cfg, **changes) -> str:
    xclbin = tmp_path / "ringgpt.xclbin"
    xclbin.write_bytes(b"xclbin bytes")
    manifest = {"kernel": "ringgpt_kernel", "config": cfg.name.rsplit("-x", 1)[0], "config_hash": cfg.hash,
                "cards": cfg.cards, "config_dict": cfg.to_dict(), "register_map_hash": registers.map_hash(cfg),
                "git_commit": "0" * 40, "tools": {}, "resources": None, "platform": DEFAULT_PLATFORM,
                "xclbin": {"path": xclbin.name, "sha256": hashlib.sha256(b"xclbin bytes").hexdigest()},
                "steps": {"verilog": "done", "link": "done"}}
    manifest.update(changes)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    return str(path)


BAD_MANIFESTS = {  # name: (changes, error, phrase)
    "another config": ({"config_hash": get_config("u280", 2).hash}, ConfigMismatchError, "rebuild it"),
    "another register map": ({"register_map_hash": "0" * 64}, ConfigMismatchError, "register map"),
    "another xclbin": ({"xclbin": {"path": "ringgpt.xclbin", "sha256": "f" * 64}}, ConfigMismatchError, "sha256"),
    "a missing xclbin": ({"xclbin": {"path": "gone.xclbin", "sha256": "f" * 64}}, AlveoUnavailableError, "missing"),
    "no xclbin built": ({"xclbin": None, "steps": {"link": "skipped: v++ is not on PATH"}}, AlveoUnavailableError,
                        "skipped: v.. is not on PATH"),
    "another kernel": ({"kernel": "vadd"}, ConfigMismatchError, "vadd"),
}


def test_a_matching_manifest_gives_its_xclbin(tmp_path):
    cfg = small(2)
    assert check_manifest(_manifest(tmp_path, cfg), cfg) == tmp_path / "ringgpt.xclbin"


@pytest.mark.parametrize("case", BAD_MANIFESTS)
def test_a_manifest_of_something_else_is_refused(case, tmp_path):
    changes, error, phrase = BAD_MANIFESTS[case]
    cfg = small(2)
    with pytest.raises(error, match=phrase):
        check_manifest(_manifest(tmp_path, cfg, **changes), cfg)


def test_the_driver_checks_the_manifest_before_it_touches_a_kernel(tmp_path):
    cfg = small(1)
    platform = FakePlatform(cfg)
    with pytest.raises(ConfigMismatchError):
        AlveoDevice(cfg, platform=platform, manifest=_manifest(tmp_path, cfg.with_cards(2)))
    assert all(not kernel.writes for kernel in platform.cards)
    with pytest.raises(AlveoUnavailableError, match="no bitstream manifest"):
        check_manifest(tmp_path / "nothing.json", cfg)


# --- PYNQ ---------------------------------------------------------------------------------------------------
class StandInPynq(types.ModuleType):
    """PYNQ 3.0.1's API as the driver uses it (pynq.Device.devices, Overlay.ip_dict, the compute unit's
    read/write, device.get_memory_by_name, pynq.allocate(target=) and the buffer it returns)."""

    def __init__(self, boards: int, offsets: dict):
        super().__init__("pynq")
        self.__version__ = "3.0.1"
        self.allocated = []
        module = self

        class Board:
            def __init__(self, index):
                self.tag, self.name = f"xrt{index}", "xilinx_u280_gen3x16_xdma_base_1"

            def get_memory_by_name(self, tag):
                return tag

        class Unit:
            def __init__(self):
                self.words = {}

            def read(self, offset):
                return self.words.get(offset, AP_IDLE)

            def write(self, offset, value):
                self.words[offset] = value

        class Overlay:
            def __init__(self, path, device):
                self.device, self.freed = device, False
                self.ip_dict = {"ringgpt_kernel_1": {"cu_name": "ringgpt_kernel:ringgpt_kernel_1",
                                                     "registers": {name: {"address_offset": offset,
                                                                          "memory": f"MEM[{name}]"}
                                                                   for name, offset in offsets.items()}},
                                "other_1": {"cu_name": "other:other_1", "registers": {}}}
                self.ringgpt_kernel_1 = Unit()

            def free(self):
                self.freed = True

        class Array(np.ndarray):
            def sync_to_device(self):
                pass

            def sync_from_device(self):
                pass

            def freebuffer(self):
                pass

        def allocate(shape, dtype, target):
            array = np.zeros(shape, dtype).view(Array)
            array.device_address, array.target = 1 << 33, target
            module.allocated.append(array)
            return array

        self.Device = types.SimpleNamespace(devices=[Board(i) for i in range(boards)])
        self.Overlay, self.allocate = Overlay, allocate


def _offsets(cfg) -> dict:
    return {r.name: r.offset for r in registers.register_map(cfg) if r.kind != "status"}


def test_pynq_platform_opens_one_overlay_per_board_and_allocates_in_the_arguments_banks(tmp_path, monkeypatch):
    cfg = small(2)
    pynq = StandInPynq(3, _offsets(cfg))
    monkeypatch.setitem(sys.modules, "pynq", pynq)
    xclbin = tmp_path / "k.xclbin"
    xclbin.write_bytes(b"x")
    platform = PynqPlatform(xclbin, cfg)
    assert [card.overlay.device.tag for card in platform.cards] == ["xrt0", "xrt1"]
    buffer = platform.cards[1].allocate(4096, "hbm02")
    assert pynq.allocated[-1].target == "MEM[hbm02]" and buffer.device_address == 1 << 33
    platform.cards[0].write(0x10, 5)
    assert platform.cards[0].read(0x10) == 5
    overlays = [card.overlay for card in platform.cards]
    platform.close()
    assert all(overlay.freed for overlay in overlays)


def test_pynq_platform_refuses_an_xclbin_with_another_register_map(tmp_path, monkeypatch):
    cfg = small(1)
    monkeypatch.setitem(sys.modules, "pynq", StandInPynq(1, {**_offsets(cfg), "rows": 0x40}))
    xclbin = tmp_path / "k.xclbin"
    xclbin.write_bytes(b"x")
    with pytest.raises(ConfigMismatchError, match="'rows'"):
        PynqPlatform(xclbin, cfg)


@pytest.mark.parametrize("pynq, phrase", [(None, "PYNQ cannot be imported"), ("no boards", "XRT finds 0")])
def test_without_pynq_or_boards_the_device_fails_at_once_with_one_line(pynq, phrase, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynq", StandInPynq(0, {}) if pynq else None)
    with pytest.raises(AlveoUnavailableError, match=phrase) as caught:
        AlveoDevice(small(1))
    assert "pip install 'ringgpt[alveo]'" in str(caught.value) and "\n" not in str(caught.value)
    result = CliRunner().invoke(cli.main, ["generate", "--backend", "alveo", "--config", "sim-small"])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and phrase in result.stderr


@pytest.mark.board
@pytest.mark.parametrize("cards", [1, 4])
def test_generation_on_the_boards_equals_the_functional_simulator(cards):
    """On a machine with U280s (cabled in a ring for 4) and bitstreams/u280-x<cards> built (docs/alveo.md)."""
    config = get_config("u280", cards)
    try:
        check_boards(config)
    except AlveoUnavailableError as exc:
        pytest.skip(str(exc))
    image = compile_model(load_model(MODELS[cards], seed=7), config, max_context=16)
    device = AlveoDevice(config)
    try:
        assert_generates_like_the_simulator(image, device)
    finally:
        device.close()


def test_the_register_map_in_the_docs_is_registers_pys():
    rows = [f"| 0x{reg.offset:03X} | `{reg.name}` | {reg.bits} | {reg.kind} | "
            f"{f'`m_axi_{reg.port}`' if reg.port else ''} | {reg.doc} |"
            for reg in registers.register_map(get_config("u280"))]
    assert "\n".join(rows) in (ROOT / "docs" / "alveo.md").read_text(), "docs/alveo.md's register table is stale"


# --- the kernels' RTL -----------------------------------------------------------------------------------------
@pytest.mark.rtl
@pytest.mark.parametrize("sim", SLOW_ON_ICARUS, indirect=True)
@pytest.mark.parametrize("cards", [pytest.param(1, marks=pytest.mark.slow), 2])  # 2 cards cover 1 and the faults
def test_the_driver_on_the_kernel_rtl(cards, sim):
    """Generation through the register map and buffers gives the simulator's tokens and logits bit for bit, under
    random AXI and ring pauses. On 2 cards, the same simulation then runs an address fault (card 0, pc 0) and a
    RECV nothing sends: the timeout, on the simulated clock, names card 0 still running."""
    from ringgpt.sim.rtl.kernel_platform import SimKernelPlatform

    image = compiled(cards)
    device = AlveoDevice(image.config, platform=SimKernelPlatform(image.config, simulator=sim, pause=True))
    try:
        assert_generates_like_the_simulator(image, device, sampling=RTL_SAMPLING)
        if cards == 1:
            return
        config = image.config
        past_abuf = Instruction.make(Opcode.LOAD, dst=Operand(Space.ABUF, 0, 0), src1=Operand(Space.ABUF, 0, 4090),
                                     rows=Dim(0, 1), n=Dim(0, 16))
        device.load(_image(config, [[past_abuf, Instruction.make(Opcode.HALT)], [Instruction.make(Opcode.HALT)]]))
        with pytest.raises(AddressFault) as caught:
            device.run(0, 1)
        assert (caught.value.card, caught.value.pc) == (0, 0)
        recv = Instruction.make(Opcode.RECV, dst=Operand(Space.ABUF, 0, 0), rows=Dim(0, 1), n=Dim(0, 4), dst_stride=4)
        device.load(_image(config, [[recv, Instruction.make(Opcode.HALT)], [Instruction.make(Opcode.HALT)]]))
        device.timeout_s = 1000 * CLOCK_PERIOD_NS * 1e-9  # 1,000 cycles of the simulated clock
        with pytest.raises(RunTimeoutError) as stuck:
            device.run(0, 1)
        assert stuck.value.cards[0][::3] == (0, "still running") and stuck.value.cards[1][::3] == (1, "done")
    finally:
        device.close()
