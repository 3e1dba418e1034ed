"""A cocotb testbench in a simulator process that serves commands over a local socket, both sides.

`SimulationProcess` (the host side, used by RtlDevice and SimKernelPlatform) starts the testbench in a thread
through `runner.run_testbench`, waits for it to connect and sends commands; `serve` (the testbench side, used by
sim/rtl/server.py and sim/rtl/kernel_server.py) connects and answers them until `quit`. A command is a tuple
(name, *arguments); an answer is ("ok", value, cycles) or ("error", traceback, cycles), `cycles` being the
simulated clock cycles so far.
"""
from __future__ import annotations

import glob
import os
import secrets
import sys
import tempfile
import threading
import traceback
from collections.abc import Awaitable, Callable, Mapping
from multiprocessing.connection import Client, Listener
from pathlib import Path

from ringgpt.host.device import DeviceError
from ringgpt.sim.cocotb_support import runner

SERVER_ENV = "RINGGPT_RTL_SERVER"
"""Environment variable that tells the testbench where to connect: 'address authkey-hex'."""
CONNECT_TIMEOUT_S = 1800
"""How long to wait for the simulator to build and connect (a first Verilator build takes minutes)."""


class RtlError(DeviceError):
    """The RTL simulation itself failed (build, crash, lost connection): not a program fault."""


def build_note(design: runner.Design, simulator: str, purpose: str) -> str | None:
    """The line to show before `design` is built for `simulator` (a first build takes minutes, a u280 core far longer,
    and says nothing meanwhile); None when a build of it is there (the build folders of runner.build:
    <label>-<16 hex digits of the Verilog's hash>/`runner.build_folder`/built.ok)."""
    folder = runner.build_folder(design, simulator, runner.waves_requested())
    if any(runner.BUILD_ROOT.glob(f"{glob.escape(design.label)}-{'[0-9a-f]' * 16}/{folder}/built.ok")):
        return None
    return (f"building {design.label} for {purpose} with {simulator}: a first build takes minutes (a u280 core much "
            f"longer); its log: {runner.BUILD_ROOT}/{design.label}-*/{folder}/build.log")


class SimulationProcess:
    """The testbench `module` on `design` in a `simulator` process, with testbench arguments `args`; `purpose`
    names what needs it in the error when the simulator is missing."""

    def __init__(self, design: runner.Design, module: str, simulator: str, args: Mapping, name: str, purpose: str):
        reason = runner.missing_reason(simulator)
        if reason:
            raise RtlError(f"{purpose} needs {simulator}: {reason}")
        note = build_note(design, simulator, purpose)
        if note:
            print(note, file=sys.stderr, flush=True)
        self.simulator = simulator
        self.cycles = 0
        """Simulated clock cycles at the last answer."""
        self._failure: BaseException | None = None
        folder = Path(tempfile.mkdtemp(prefix=f"ringgpt-{name}-"))
        address, key = str(folder / "socket"), secrets.token_bytes(16)
        listener = Listener(address, family="AF_UNIX", authkey=key)

        def simulate():
            try:
                runner.run_testbench(design, module, simulator, args=dict(args), name=name,
                                     env={SERVER_ENV: f"{address} {key.hex()}"}, quiet=True)
            except BaseException as exc:       # reported to the caller by call()
                self._failure = exc
            finally:
                try:                           # unblock accept() if the simulator never connected
                    Client(address, family="AF_UNIX", authkey=key).close()
                except OSError:
                    pass

        self._thread = threading.Thread(target=simulate, name=f"{name}-simulator", daemon=True)
        self._thread.start()
        listener._listener._socket.settimeout(CONNECT_TIMEOUT_S)
        try:
            self._conn = listener.accept()
        except OSError as exc:
            raise RtlError(f"the {simulator} simulation did not connect: {exc}") from None
        finally:
            listener.close()
        if self._failure is not None:
            self._conn.close()
            raise RtlError(f"the {simulator} simulation failed to start: {self._failure}")

    def call(self, *command):
        """Sends (name, *arguments) and returns the answer's value; RtlError when the testbench failed."""
        if self._conn is None:
            raise RtlError(f"the {self.simulator} simulation is closed")
        try:
            self._conn.send(command)
            status, value, self.cycles = self._conn.recv()
        except (EOFError, OSError):
            self._conn = None
            self._thread.join(timeout=60)
            raise RtlError(f"the {self.simulator} simulation stopped during {command[0]}: {self._failure}") from None
        if status != "ok":
            raise RtlError(f"the {self.simulator} simulation failed in {command[0]}: {value}")
        return value

    def close(self) -> None:
        """Says quit and waits for the simulator to end."""
        if self._conn is not None:
            try:
                self.call("quit")
            except RtlError:
                pass
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self._thread.join(timeout=120)


async def serve(commands: Mapping[str, Callable[..., Awaitable]], cycles: Callable[[], int]) -> None:
    """The testbench side: connects to the SimulationProcess named by SERVER_ENV and runs its commands until quit.
    A command that raises is answered with its traceback and ends the testbench."""
    address, key = os.environ[SERVER_ENV].split()
    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(key))
    try:
        while True:
            name, *arguments = conn.recv()
            if name == "quit":
                conn.send(("ok", None, cycles()))
                return
            try:
                conn.send(("ok", await commands[name](*arguments), cycles()))
            except Exception:
                conn.send(("error", traceback.format_exc(), cycles()))
                raise
    finally:
        conn.close()
