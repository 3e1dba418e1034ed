"""scripts/bench_appliance.py: what --keep keeps of an earlier run (the host's measured stages) and what it takes
from this run (the device's modeled time, so the total and the host's share)."""


def test_kept_host_stages_are_rebased_on_this_runs_device_time(load_script):
    bench = load_script("bench_appliance")
    position = bench.DECODE_POSITIONS[0]
    earlier = {"GPT-2 345M, 1 card": {"greedy": {"200 MHz": {"device": 2e-3, "launch": 30e-6, "sampling": 10e-6,
                                                            "host": 40e-6, "total": 2.04e-3, "host_share": 0.02}}},
               "a case this run has not": {"greedy": {}}}
    results = [{"label": "GPT-2 345M, 1 card", "decode": {position: {"variants": {"200 MHz": {"device_ms": 2.5}}}}},
               {"label": "GPT-2 124M, 1 card", "decode": {position: {"variants": {"200 MHz": {"device_ms": 0.9}}}}}]
    rebased = bench.rebased_host_path(earlier, results)
    parts = rebased["GPT-2 345M, 1 card"]["greedy"]["200 MHz"]
    assert parts["device"] == 2.5e-3 and parts["total"] == 40e-6 + 2.5e-3 and parts["host_share"] == 40e-6 / 2.5e-3
    assert (parts["launch"], parts["sampling"], parts["host"]) == (30e-6, 10e-6, 40e-6)       # measured: kept
    assert list(rebased) == ["GPT-2 345M, 1 card"]          # nothing kept for a case without an earlier entry
