"""What every device back end's tests check the same way: generation gives the functional simulator's tokens and
logits bit for bit, and images of hand-written programs to run on it."""
import numpy as np

from ringgpt.host.image import ApplianceImage, CardImage
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import Appliance
from ringgpt.hw.program import Program
from ringgpt.sim.functional import SimulatorDevice

PROMPT = [5, 17, 3, 60, 22]
SAMPLING = SamplingConfig(max_new_tokens=3, stop_at_eos=False)


def assert_generates_like_the_simulator(image: ApplianceImage, device, prompt=PROMPT, sampling=SAMPLING) -> None:
    """Generates with `device` and with the functional simulator: the same tokens and logits."""
    golden = Appliance(SimulatorDevice(image.config), image).generate(prompt, sampling)
    result = Appliance(device, image).generate(prompt, sampling)
    assert result.generated_ids == golden.generated_ids
    np.testing.assert_array_equal(result.logits, golden.logits)


def program_image(config, programs: list, host_words: int = 64, hbm_segments=()) -> ApplianceImage:
    """An image of hand-written programs (one list of Instructions per card) with 4,096 HBM words."""
    return ApplianceImage(config, [CardImage(Program(p, config.name, config.hash, card, config.cards),
                                             hbm_segments=list(hbm_segments), hbm_words=4096, host_words=host_words)
                                   for card, p in enumerate(programs)])
