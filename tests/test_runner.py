"""sim/cocotb_support/runner.py's build cache: a design is converted and built once, found again by the digest of
its sources without converting it, converted again when a source changes, and its build figures are kept."""
import json

import pytest

from ringgpt.sim.cocotb_support import runner

DESIGN = runner.Design.of("ringgpt.hw.arith.to_fp16:ToFP16")


@pytest.fixture
def build_root(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "BUILD_ROOT", tmp_path)
    if runner.missing_reason("icarus"):
        pytest.skip(runner.missing_reason("icarus"))
    return tmp_path


def test_a_design_is_found_again_without_converting_it(build_root, monkeypatch):
    first = runner.build(DESIGN, "icarus")
    figures = json.loads((first / "build.json").read_text())
    assert figures["verilog_bytes"] == len(runner.verilog(DESIGN)) and figures["build_s"] >= 0
    assert figures["peak_rss_mb"] > 0

    def no_conversion(design):
        raise AssertionError("converted again")

    monkeypatch.setattr(runner, "verilog", no_conversion)
    assert runner.build(DESIGN, "icarus") == first
    # another source digest: the design is converted again (and its Verilog, unchanged, finds the same build)
    monkeypatch.setattr(runner, "sources_digest", lambda component: "changed")
    with pytest.raises(AssertionError, match="converted again"):
        runner.build(DESIGN, "icarus")


def test_an_index_entry_of_another_design_or_a_missing_build_is_not_used(build_root, monkeypatch):
    first = runner.build(DESIGN, "icarus")
    entry = runner._index_entry(DESIGN, "icarus", False)
    converted = []
    real = runner.verilog
    monkeypatch.setattr(runner, "verilog", lambda design: converted.append(design) or real(design))
    entry.write_text(json.dumps({"design": "something else", "build_dir": str(first)}))
    assert runner.build(DESIGN, "icarus") == first and len(converted) == 1
    (first / "built.ok").unlink()
    entry.write_text(json.dumps({"design": DESIGN.to_json(), "build_dir": str(first)}))
    assert runner.build(DESIGN, "icarus") == first and len(converted) == 2 and (first / "built.ok").exists()
    entry.write_text("not json")
    assert runner.build(DESIGN, "icarus") == first and len(converted) == 3


def test_a_component_from_outside_the_package_is_not_indexed():
    # its sources cannot be told, so only the Verilog's digest finds its build
    assert runner._index_entry(runner.Design.of("amaranth.lib.fifo:SyncFIFO", width=8, depth=4), "icarus", False) is None
    assert runner._index_entry(DESIGN, "icarus", False) is not None
