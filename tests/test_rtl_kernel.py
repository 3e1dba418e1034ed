"""The Vitis kernel (hw/kernel/kernel.py) on one card through its register map (sim/tb/tb_kernel.py): register
semantics against a golden written from registers.py, a compiled GPT-2 run with every buffer above 4 GiB giving
the functional simulator's host buffer bit for bit, and an illegal word ending the run with its pc. One build of
the kernel per simulator, its three cocotb tests in one simulation; on Icarus by default, on Verilator with
-m slow (its build of the whole core is long)."""
import json

import numpy as np
import pytest

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.models import load_model
from ringgpt.host.runtime import Appliance
from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.isa import INSTRUCTION_BYTES, Opcode
from ringgpt.sim.cocotb_support.pytest_plugin import SLOW_ON_ICARUS
from ringgpt.sim.cocotb_support.runner import LARGE_DESIGN_CXX_OPT, Design
from ringgpt.sim.functional import SimulatorDevice

CONFIG = small_config("sim-small", abuf_words=4096, wbuf_words=2048)
MODEL = "synthetic:n_layer=1,n_embd=16,n_head=1,vocab_size=32"
PROMPT = [5, 17]
"""Two tokens of the smallest model: a real program (attention over two positions) in about 1,700 cycles."""


def kernel_design(config) -> Design:
    return Design.of("ringgpt.sim.tb.tb_kernel:KernelBench",
                     config=json.dumps(config.to_dict(), sort_keys=True)).with_cxx_opt(LARGE_DESIGN_CXX_OPT)


def write_case(path) -> str:
    """The program, HBM segments and host buffer of the prompt's run, and the functional simulator's host
    buffer after it, as the testbench reads them (.npz)."""
    image = compile_model(load_model(MODEL, seed=7), CONFIG, max_context=16)
    card = image.cards[0]
    device = SimulatorDevice(image.config)
    Appliance(device, image).run(0, PROMPT)
    after = device.read_host(0, 0, card.host_words).view(np.uint16)
    host = image.meta["host"]
    before = np.zeros(card.host_words, np.uint16)
    before[host["ids_offset"]:host["ids_offset"] + len(PROMPT)] = PROMPT
    (logits,) = host["logits"]
    logits_offset, logits_count = logits["offset"], logits["vocab"][1] - logits["vocab"][0]
    instructions = card.program.instructions
    program = np.frombuffer(b"".join(i.encode().to_bytes(INSTRUCTION_BYTES, "little") for i in instructions), np.uint8)
    segments, starts = [], 0
    for address, words in card.hbm_segments:
        segments.append((address, starts, words.size))
        starts += words.size
    np.savez(path, program=program.reshape(len(instructions), -1), hbm=np.concatenate(
        [np.asarray(w).view(np.uint16) for _, w in card.hbm_segments]), segments=np.array(segments, np.int64),
        host_before=before, host_after=after, pos=0, rows=len(PROMPT), logits_offset=logits_offset,
        logits_count=logits_count, halt_pc=[i.opcode for i in instructions].index(Opcode.HALT))
    return str(path)


@pytest.mark.rtl
@pytest.mark.parametrize("sim", SLOW_ON_ICARUS, indirect=True)
def test_kernel_registers_program_and_errors(sim, run_tb, tmp_path):
    run_tb(kernel_design(CONFIG), "ringgpt.sim.tb.tb_kernel", case=write_case(tmp_path / "case.npz"))
