"""The cycle model in its worker process (sim/cycle_model/worker.py): every run's reports equal the in-process
schedule of the same traces, timing variants included, through failed runs, a dead worker and the device's policy
of when to start one."""
import pytest

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.models import load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import Appliance
from ringgpt.hw.config import get_config
from ringgpt.sim.cycle_model import schedule
from ringgpt.sim.functional import SimulatorDevice, StepLimitError
from ringgpt.sim.cycle_model import worker as worker_module
from ringgpt.sim.functional import device as device_module

SPEC = "synthetic:n_layer=2,n_embd=64,n_head=2,vocab_size=300,n_positions=64"
PROMPT = [11, 42, 7, 199, 3, 250]
CONFIG = get_config("sim-small", 2)
TIMING = {"at 100 MHz": CONFIG.at_clock(100)}


@pytest.fixture(scope="module")
def image():
    return compile_model(load_model(SPEC, seed=5), CONFIG, max_context=32)


class CheckedDevice(SimulatorDevice):
    """A simulator whose every run's reports are checked against the in-process schedule of its traces."""

    def run(self, pos, rows):
        stats = super().run(pos, rows)
        traces = [card.trace for card in self.cards]
        assert self.last_report == schedule(traces, self.config)
        assert self.last_variant_reports == {label: schedule(traces, other) for label, other in self.timing.items()}
        self.checked = getattr(self, "checked", 0) + 1
        return stats


def _generate(device, image, tokens=4):
    return Appliance(device, image).generate(PROMPT, SamplingConfig(max_new_tokens=tokens, stop_at_eos=False))


def test_worker_reports_equal_the_in_process_schedule(image):
    worker_device = CheckedDevice(CONFIG, timing=TIMING, schedule_worker=True)
    here = SimulatorDevice(CONFIG, timing=TIMING, schedule_worker=False)
    try:
        ours, theirs = _generate(worker_device, image), _generate(here, image)
        assert worker_device._worker is not None and worker_device._worker.alive and here._worker is None
        assert worker_device.checked == len(ours.runs) > 1
        assert ours.generated_ids == theirs.generated_ids
        for a, b in zip(ours.runs, theirs.runs, strict=True):
            assert (a.cycles, a.seconds, a.hbm_bytes, a.breakdown, a.variants) == \
                   (b.cycles, b.seconds, b.hbm_bytes, b.breakdown, b.variants)
    finally:
        worker_device.close()


def test_a_failed_run_is_dropped_by_the_worker(image):
    device = CheckedDevice(CONFIG, timing=TIMING, schedule_worker=True)
    try:
        _generate(device, image, tokens=2)
        device.max_steps = len(device.cards[0].trace) // 2  # stopped halfway: the worker's reply is dropped
        with pytest.raises(StepLimitError):
            _generate(device, image, tokens=2)
        device.max_steps = device_module.DEFAULT_MAX_STEPS
        last_pc = len(device.cards[1].program) - 1

        def interrupt(card, pc, read):
            raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):  # any exception within a run, a watch's included
            device.run_watched(0, 1, {(1, last_pc): interrupt})
        before = device.checked
        _generate(device, image, tokens=3)
        assert device.checked == before + 3 and device._worker.alive
    finally:
        device.close()


def test_a_dead_worker_is_warned_about_and_the_device_schedules_itself(image):
    device = CheckedDevice(CONFIG, schedule_worker=True)
    _generate(device, image, tokens=1)
    process = device._worker._process
    process.kill()
    process.wait()
    with pytest.warns(RuntimeWarning, match="worker process failed"):
        _generate(device, image, tokens=2)
    assert device._worker is None and device.checked == 1 + 2  # the prompt run before, prompt and decode after
    _generate(device, image, tokens=2)  # not started again
    assert device._worker is None


def test_an_interrupt_while_waiting_for_the_reports_closes_the_worker(image, monkeypatch):
    """Interrupted while reading the worker's reply (which may stay half read), the device closes the worker, and its
    next run warns and schedules in its own process: no run reads another run's reports."""
    device = CheckedDevice(CONFIG, schedule_worker=True)
    try:
        _generate(device, image, tokens=1)
        process = device._worker._process

        def interrupted(process):
            raise KeyboardInterrupt
        with monkeypatch.context() as patch:
            patch.setattr(worker_module, "_reply", interrupted)
            with pytest.raises(KeyboardInterrupt):
                device.run(0, 1)
        assert process.poll() is not None
        with pytest.warns(RuntimeWarning, match="worker process was closed"):
            _generate(device, image, tokens=2)
        assert device._worker is None and device.checked == 1 + 2  # the interrupted run is not counted
    finally:
        device.close()


def _worker_after_two_runs(image, cpus, monkeypatch, compute=True):
    """Whether a default device has its worker after two runs (with WORKER_AFTER_S tiny), and that worker's process."""
    monkeypatch.setattr(device_module, "_usable_cpus", lambda: cpus)
    device = CheckedDevice(CONFIG, compute=compute)
    try:
        device.load(image)
        device.run(0, 1)
        assert device._worker is None  # the first run is scheduled here
        device.run(1, 1)
        assert device.checked == 2 and device.seconds["cycle_model"] > 0
        return device._worker is not None, device._worker and device._worker._process
    finally:
        device.close()


def test_the_device_starts_a_worker_once_it_has_scheduled_long_enough(image, monkeypatch):
    monkeypatch.delenv("RINGGPT_SCHEDULE_WORKER", raising=False)
    monkeypatch.setattr(device_module, "WORKER_AFTER_S", 1e-9)
    started, process = _worker_after_two_runs(image, 2, monkeypatch)
    assert started and process.poll() is not None  # close() ended it
    assert not _worker_after_two_runs(image, 1, monkeypatch)[0]
    assert not _worker_after_two_runs(image, 2, monkeypatch, compute=False)[0]
    monkeypatch.setenv("RINGGPT_SCHEDULE_WORKER", "0")
    assert not _worker_after_two_runs(image, 2, monkeypatch)[0]
    monkeypatch.setenv("RINGGPT_SCHEDULE_WORKER", "yes")
    with pytest.warns(RuntimeWarning, match="RINGGPT_SCHEDULE_WORKER='yes' is neither 0 nor 1"):
        assert not _worker_after_two_runs(image, 1, monkeypatch)[0]


@pytest.mark.parametrize("cards", [2, 3])
def test_the_workers_traces_are_the_cards_own(cards):
    """The traces the worker resolves from the programs and (pos, rows) alone equal the cards' traces, run after run
    (3 cards: 4 heads split unevenly, programs that differ), and instructions whose registers did not change are the
    same objects as in the last run (the schedule's memo of derived costs)."""
    from ringgpt.hw.resolved import Decoded
    from ringgpt.sim.cycle_model.worker import card_traces
    config = get_config("sim-small", cards)
    device = SimulatorDevice(config, schedule_worker=False)
    device.load(compile_model(load_model(SPEC.replace("n_head=2", "n_head=4"), seed=5), config, max_context=32))
    programs = [[Decoded(decoded.inst) for decoded in card.program] for card in device.cards]
    gathered = [{} for _ in programs]
    last = None
    for pos, rows in [(0, 4), (4, 1), (5, 1), (6, 1)]:
        device.run(pos, rows)
        traces = card_traces(programs, gathered, pos, rows)
        assert traces == [card.trace for card in device.cards]
        if last is not None and rows == 1 and pos > 4:
            same = sum(a is b for trace, before in zip(traces, last) for a, b in zip(trace, before))
            assert same > 0.5 * sum(map(len, traces))
        last = traces
