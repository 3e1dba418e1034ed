"""Environment faults and smaller CLI defects (issue 35): a full disk, a folder that cannot be written, the image
cache's folder a file, standard output full or closed, PYNQ/XRT exceptions, Ctrl-C and SIGTERM in
scripts/build_bitstream.py, `check --json` over a file that is not an earlier report, contradicting options, the
range of `check --steps`, the note before a long RTL build, and the exit codes defined once.

Each user-facing case asserts the exit code, exactly one line on stderr and no traceback. Tests run as root, where
chmod does not stop a write: an unwritable folder is stood in for by the OSError it raises, in-process (CliRunner)."""
from __future__ import annotations

import errno
import importlib
import importlib.util
import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ringgpt.host import cli
from ringgpt.host.alveo import AlveoDevice, AlveoUnavailableError, driver
from ringgpt.host.cli_support import (CHECK_REPORT_MARK, EXIT_BROKEN_PIPE, EXIT_CODES, EXIT_FAULT, EXIT_INTERRUPTED,
                                      EXIT_STATUS_HELP, EXIT_USER_ERROR)
from ringgpt.host.device import DeviceError
from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Instruction, Opcode
from ringgpt.sim.cocotb_support import runner
from ringgpt.sim.rtl.device import design_of
from ringgpt.sim.rtl.process import RtlError, SimulationProcess, build_note

from device_checks import program_image
from test_bad_input import TINY, command, run

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT / "scripts" / "build_bitstream.py"


def one_line(stderr: str | bytes) -> str:
    """The one line on stderr (asserting there is exactly one and no traceback)."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    lines = text.splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# --- operating-system errors: one line naming the path and what to do, exit 2 when the user can fix it ------------

@pytest.mark.parametrize("code, name, what, exit_code", [
    (errno.ENOSPC, "No space left on device", "no space left on device (ENOSPC): free some space or write elsewhere",
     EXIT_USER_ERROR),
    (errno.EDQUOT, "Disk quota exceeded", "disk quota exceeded (EDQUOT): free some space (your disk quota is used "
                                          "up) or write elsewhere", EXIT_USER_ERROR),
    (errno.EACCES, "Permission denied", "permission denied (EACCES): check its permissions or choose another place",
     EXIT_USER_ERROR),
    (errno.EROFS, "Read-only file system", "read-only file system (EROFS): choose a place on a writable file system",
     EXIT_USER_ERROR),
    (errno.ENOTDIR, "Not a directory", "not a directory (ENOTDIR): a part of the path is a file, not a folder: fix "
                                       "the path", EXIT_USER_ERROR),
    (errno.EISDIR, "Is a directory", "is a directory (EISDIR): it is a folder: give a file", EXIT_USER_ERROR),
    (errno.EIO, "Input/output error", "input/output error (EIO)", EXIT_FAULT),
])
def test_an_os_error_names_its_path_and_what_to_do(code, name, what, exit_code, monkeypatch):
    def backend(request, on_token, status):
        raise OSError(code, name, "/data/run/out.bin")
    monkeypatch.setitem(cli.BACKENDS, "reference", backend)
    result = CliRunner().invoke(cli.main, ["generate", "--backend", "reference", "--model", TINY, "hello"])
    assert result.exit_code == exit_code
    assert one_line(result.stderr) == f"error: /data/run/out.bin: {what}"


def test_an_error_in_the_image_cache_says_how_to_move_the_cache(tmp_path, monkeypatch):
    importlib.import_module("ringgpt.host.runtime.images")  # what makes an error the cache's possible

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("RINGGPT_CACHE_DIR", str(tmp_path / "afile"))

    def backend(request, on_token, status):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(tmp_path / "afile" / "images"))
    monkeypatch.setitem(cli.BACKENDS, "reference", backend)
    result = CliRunner().invoke(cli.main, ["generate", "--backend", "reference", "--model", TINY, "hello"])
    assert result.exit_code == EXIT_USER_ERROR
    assert one_line(result.stderr) == (f"error: {tmp_path}/afile/images (the image cache: set RINGGPT_CACHE_DIR to a "
                                       "folder you can write): not a directory (ENOTDIR): a part of the path is a "
                                       "file, not a folder: fix the path")


# --- standard output full or closed ---------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["ringgpt", "--help"], ["ringgpt", "generate", "--help"], ["compiler", "--help"]])
def test_a_full_standard_output_is_named(argv, tmp_path):
    with open("/dev/full", "w") as full:
        result = subprocess.run([*command(argv[0]), *argv[1:]], stdout=full, stderr=subprocess.PIPE, cwd=tmp_path,
                                timeout=60)
    assert result.returncode == EXIT_USER_ERROR
    assert one_line(result.stderr) == ("error: cannot write to standard output: no space left on device (ENOSPC): "
                                       "free some space or write elsewhere")


def _closed_pipe_run(argv: list, cwd: Path) -> subprocess.CompletedProcess:
    """`argv` with standard output a pipe whose reader has gone (as after `| head -1`)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, cwd=cwd, timeout=120)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [["--help"], ["generate", "--backend", "reference", "--model", TINY,
                                               "--max-new-tokens", "3", "hello"]])
def test_a_closed_standard_output_ends_quietly_with_141(args, tmp_path):
    result = _closed_pipe_run([*command("ringgpt"), *args], tmp_path)
    stderr = result.stderr.decode()
    assert result.returncode == EXIT_BROKEN_PIPE == 141, stderr
    assert "error" not in stderr and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


# --- options -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, line", [
    (["generate", "--greedy", "--sample"], "error: --greedy and --sample contradict each other: give one (greedy is "
                                          "the default) (see 'ringgpt generate --help')"),
    (["generate", "--sample", "--greedy", "--seed", "3"],
     "error: --greedy and --sample contradict each other: give one (greedy is the default) (see 'ringgpt generate "
     "--help')"),
    (["check", "--model", TINY, "--steps", "100000", "hi"],
     "error: the prompt's 1 tokens + --steps 100000 = 100001 exceeds the appliance's context of 1024 positions: give "
     "--steps in 0..1023 (see 'ringgpt check --help')"),
    (["check", "--model", TINY, "--max-context", "16", "--steps", "20", "hi"],
     "error: the prompt's 1 tokens + --steps 20 = 21 exceeds the appliance's context of 16 positions: give --steps in "
     "0..15 (or compile with a larger --max-context) (see 'ringgpt check --help')"),
    (["generate", "--model", TINY, "--max-new-tokens", "5000", "hi"],
     "error: the prompt's 1 tokens + --max-new-tokens 5000 = 5001 exceeds the appliance's context of 1024 positions: "
     "give --max-new-tokens in 1..1023 (see 'ringgpt generate --help')"),
])
def test_contradicting_options_and_too_many_steps_are_one_line(args, line, tmp_path):
    result = run([*command("ringgpt"), *args], tmp_path)
    assert result.returncode == EXIT_USER_ERROR and result.stdout == b""
    assert one_line(result.stderr) == line


def test_the_exit_codes_are_defined_once_and_every_help_lists_them(tmp_path):
    assert {0, 1, 2, 3, 130, 141} == set(EXIT_CODES)
    for code, meaning in EXIT_CODES.items():
        assert f"{code} {meaning}" in EXIT_STATUS_HELP
    for args in (["--help"], ["generate", "--help"], ["check", "--help"]):
        shown = " ".join(run([*command("ringgpt"), *args], tmp_path).stdout.decode().split())
        listed = re.search(r"Exit status: (.*)\.", shown).group(1)
        assert [int(part.split()[0]) for part in listed.split("; ")] == list(EXIT_CODES), shown


def test_the_compilers_help_lists_the_statuses_it_returns(tmp_path):
    shown = " ".join(run([*command("compiler"), "--help"], tmp_path).stdout.decode().split())
    listed = re.search(r"Exit status: (.*)\.", shown).group(1)
    assert [int(part.split()[0]) for part in listed.split("; ")] == [0, 1, 2, 130, 141], shown


# --- check --json --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target, phrase", [  # a FIFO, not /dev/full: code without the check, run as root, replaced it
    ("notes.txt", "exists and is not a report of ringgpt check: ringgpt does not replace it"),
    ("link.json", "is a symbolic link: ringgpt neither writes through nor replaces one"),
    ("fifo.json", "exists and is not a report of ringgpt check"),
])
def test_check_json_never_replaces_what_is_not_an_earlier_report(target, phrase, tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    (tmp_path / "report.json").write_text(json.dumps({**CHECK_REPORT_MARK, "passed": True}))
    os.symlink(tmp_path / "report.json", tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo.json")
    result = run([*command("ringgpt"), "check", "--model", TINY, "--json", target, "hi"], tmp_path)
    assert result.returncode == EXIT_USER_ERROR
    assert one_line(result.stderr) == f"error: --json {target} {phrase}" + one_line(result.stderr).partition(phrase)[2]
    assert (tmp_path / "notes.txt").read_text() == "mine\n" and stat.S_ISFIFO(os.stat(tmp_path / "fifo.json").st_mode)
    assert os.readlink(tmp_path / "link.json") == str(tmp_path / "report.json")


def test_check_json_replaces_an_earlier_report_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGGPT_CACHE_DIR", str(tmp_path / "cache"))
    report = tmp_path / "report.json"
    report.write_text(json.dumps({**CHECK_REPORT_MARK, "verdict": "an earlier one"}))
    result = CliRunner().invoke(cli.main, ["check", "--model", TINY, "--cards", "1", "--steps", "1", "--json",
                                           str(report), "hi"])
    assert result.exit_code == 0, result.stderr
    written = json.loads(report.read_text())
    assert written.items() >= CHECK_REPORT_MARK.items() and written["verdict"].startswith("PyTorch FP32 reference")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "report.json"]  # no temporary left


# --- the alveo back end: PYNQ's and XRT's exceptions ------------------------------------------------------------------

class FailingKernel:
    """A kernel whose every register read fails as XRT's do."""

    def read(self, offset: int) -> int:
        raise RuntimeError("xrt::kernel: device is busy\n(xclExecWait)")


class FailingPlatform:
    description = "1 Alveo board(s) with k.xclbin"
    default_timeout_s = 1.0

    def __init__(self):
        self.cards = [FailingKernel()]

    def close(self) -> None:
        pass


def test_an_xrt_exception_is_one_device_error_naming_what_failed():
    cfg = get_config("sim-small", 1)
    device = AlveoDevice(cfg, platform=FailingPlatform())
    with pytest.raises(DeviceError) as info:
        device.load(program_image(cfg, [[Instruction.make(Opcode.HALT)]]))
    assert str(info.value) == ("loading the image on 1 Alveo board(s) with k.xclbin failed: RuntimeError: "
                               "xrt::kernel: device is busy (xclExecWait); " + driver.RESET_HINT)
    assert info.value.exit_code == EXIT_FAULT


def test_a_pynq_exception_while_opening_the_boards_says_what_to_check(tmp_path, monkeypatch):
    def failing_overlay(xclbin, cfg):
        raise OSError(errno.EACCES, "Permission denied", "/dev/dri/renderD128")
    monkeypatch.setattr(driver, "check_boards", lambda cfg, manifest: tmp_path / "k.xclbin")
    monkeypatch.setattr(driver, "PynqPlatform", failing_overlay)
    with pytest.raises(AlveoUnavailableError) as info:
        AlveoDevice(get_config("sim-small", 1))
    assert str(info.value) == (f"opening 1 Alveo board(s) with {tmp_path}/k.xclbin failed: PermissionError: [Errno "
                               "13] Permission denied: '/dev/dri/renderD128'; check the boards and XRT with `xbutil "
                               "examine`, and that no other process holds them")


# --- the RTL back end: a note before a long build, nothing when built -----------------------------------------------

def test_a_note_comes_before_a_first_rtl_build_and_not_when_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "BUILD_ROOT", tmp_path)
    monkeypatch.delenv(runner.WAVES_ENV, raising=False)
    monkeypatch.setattr(runner, "missing_reason", lambda simulator: None)

    def no_simulator(*args, **kwargs):
        raise RuntimeError("stand-in: no simulator runs here")
    monkeypatch.setattr(runner, "run_testbench", no_simulator)
    design = design_of(get_config("sim-small", 2))
    with pytest.raises(RtlError, match="stand-in"):
        SimulationProcess(design, "ringgpt.sim.rtl.server", "verilator", {}, "rtl-device", "the rtl backend")
    assert one_line(capsys.readouterr().err) == (
        f"building {design.label} for the rtl backend with verilator: a first build takes minutes (a u280 core much "
        f"longer); its log: {tmp_path}/{design.label}-*/verilator{design.cxx_opt}-{runner.VERILATOR_ARGS_TAG}/build.log")
    assert design.cxx_opt == "-O0"         # the rtl backend's designs: their Verilator builds' folders say so
    built = tmp_path / f"{design.label}-0123456789abcdef" / f"verilator-O0-{runner.VERILATOR_ARGS_TAG}"
    built.mkdir(parents=True)
    (built / "built.ok").write_text("{}")
    assert build_note(design, "verilator", "the rtl backend") is None
    assert build_note(design, "icarus", "the rtl backend") is not None


# --- scripts/build_bitstream.py: Ctrl-C and SIGTERM -------------------------------------------------------------------

SLOW_BUILD = f"""
import runpy, sys, time
from ringgpt.hw.kernel.kernel import KernelTop
def verilog(cfg):
    print("converting", flush=True)
    time.sleep(60)
KernelTop.verilog = verilog
sys.argv = ["build_bitstream.py", "--config", "sim-small", "--cards", "1", "--skip-lint", "--skip-synth", "--force",
            "--out", sys.argv[1]]
runpy.run_path({str(BUILD_SCRIPT)!r}, run_name="__main__")
"""


@pytest.mark.parametrize("sent, existing", [(signal.SIGINT, False), (signal.SIGTERM, True)])
def test_an_interrupted_build_removes_what_it_wrote_and_says_so_in_one_line(sent, existing, tmp_path):
    out = tmp_path / "build"
    if existing:
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline() == b"converting\n"
    assert (out / "manifest.json").exists()
    proc.send_signal(sent)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED
    if existing:
        assert one_line(stderr) == f"build_bitstream: interrupted; removed what it had added to {out}"
        assert [p.name for p in out.iterdir()] == ["notes.txt"]
    else:
        assert one_line(stderr) == f"build_bitstream: interrupted; removed {out}"
        assert not out.exists()


def test_an_interrupt_over_an_earlier_build_records_the_step_in_its_manifest(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("build_bitstream", BUILD_SCRIPT)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    monkeypatch.setattr(build.KernelTop, "verilog", lambda cfg: "module ringgpt_kernel(); endmodule\n")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no vivado, v++: an earlier build that stopped before them
    out = tmp_path / "build"
    argv = ["--config", "sim-small", "--cards", "1", "--skip-lint", "--skip-synth", "--out", str(out)]
    assert build.main(argv) == EXIT_USER_ERROR
    before = sorted(p.name for p in out.iterdir())
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    def interrupted(cfg, target, floorplan=None):
        (out / "half-written.tcl").write_text("")
        raise KeyboardInterrupt
    monkeypatch.setattr(build.vitis, "vitis_files", interrupted)
    capsys.readouterr()
    assert build.main(argv) == EXIT_INTERRUPTED
    assert one_line(capsys.readouterr().err) == f"build_bitstream: interrupted; removed what it had added to {out}"
    assert sorted(p.name for p in out.iterdir()) == before
    steps = json.loads((out / "manifest.json").read_text())["steps"]
    assert steps == {"verilog": "done", "lint": "skipped: --skip-lint", "resources": "skipped: --skip-synth",
                     "vitis_sources": "interrupted", "package_xo": "skipped: interrupted",
                     "link": "skipped: interrupted"}
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
