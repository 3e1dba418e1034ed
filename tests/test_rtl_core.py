"""Whole programs on the RTL: the compiler's programs for small synthetic GPT-2 models at sim-small, a prompt
run then decode runs, on 1 core and on rings of 2 and 4 cores in one simulation (RtlDevice), with logits
bit-identical to the functional simulator's; AXI memories and ring links pause at random."""
import numpy as np
import pytest

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.models import load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import Appliance
from ringgpt.hw.core.datapath import small_config
from ringgpt.sim.functional import SimulatorDevice
from ringgpt.sim.rtl.device import RtlDevice

PROMPT = [5, 17, 3, 60, 22]
SAMPLING = SamplingConfig(max_new_tokens=3, stop_at_eos=False)
CASES = {  # name: (model spec, cards)
    "1 core": ("synthetic:n_layer=1,n_embd=32,n_head=2,vocab_size=64", 1),
    "2 cores, 3 heads": ("synthetic:n_layer=1,n_embd=48,n_head=3,vocab_size=64", 2),
    "4 cores": ("synthetic:n_layer=1,n_embd=64,n_head=4,vocab_size=64", 4),
}


@pytest.mark.rtl
@pytest.mark.parametrize("case", CASES)
def test_generation_is_bit_identical_to_the_functional_simulator(case, sim):
    spec, cards = CASES[case]
    config = small_config("sim-small", abuf_words=4096, wbuf_words=2048).with_cards(cards)
    image = compile_model(load_model(spec, seed=7), config, max_context=16)
    golden = Appliance(SimulatorDevice(image.config), image).generate(PROMPT, SAMPLING)
    device = RtlDevice(image.config, simulator=sim, pause=True)
    try:
        result = Appliance(device, image).generate(PROMPT, SAMPLING)
    finally:
        device.close()
    assert result.generated_ids == golden.generated_ids
    np.testing.assert_array_equal(result.logits, golden.logits)
