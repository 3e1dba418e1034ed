"""The cycle model's schedule in a second process, beside the functional simulator.

A card's trace in a run is a function of its program and the run's (pos, rows) alone: programs have no branches, and
the registers operands read change only by control instructions (`hw/resolved.trace_run`). So the worker process
(`python -m ringgpt.sim.cycle_model.worker`) holds the cards' programs (`ScheduleWorker.load`, whenever the simulator's
programs change) and, told a run's (pos, rows) as it starts (`begin`), resolves the cards' traces itself and schedules
them while the simulator executes the same instructions: only the run's two integers cross the pipe before the
reports come back (`finish`). The reports are those of `schedule(traces, cfg)` over the cards' own traces in the
simulator's process, field for field (tests/test_schedule_worker.py). An instruction whose registers are unchanged
resolves to the same Resolved object run after run (Decoded's memo; an ALLGATHER's through the worker's own memo, as
the cards keep theirs), so the schedule reuses its derived costs (scheduler._costed) as in the simulator's process.
Frames on the pipes: an 8-byte little-endian length, then a pickle; every run gets one reply.
"""
from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
from typing import BinaryIO

from ringgpt.hw.isa import Opcode
from ringgpt.hw.resolved import Decoded, trace_run, with_gather_slices

from .scheduler import schedule

_LENGTH = struct.Struct("<Q")


def _send(stream: BinaryIO, message) -> None:
    data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream: BinaryIO):
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the pipe closed")
    size = _LENGTH.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the pipe closed within a frame")
    return pickle.loads(data)


def _tell(process: subprocess.Popen, message) -> None:
    _send(process.stdin, message)


def _reply(process: subprocess.Popen):
    return _receive(process.stdout)


class WorkerError(RuntimeError):
    """The worker process failed or its pipe closed (the simulator then schedules in its own process)."""


class ScheduleWorker:
    """The simulator's end of a worker process that schedules its runs under `config` and every `timing` variant.

    `load(programs)` whenever the cards' programs change; per run `begin(pos, rows)`, then `finish()` for
    (report, {label: report}) or `abort()` when the run failed."""

    def __init__(self, config, timing: dict):
        self._process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
        self.programs = None
        """The programs the worker holds (the simulator's lists of Decoded, by identity), None before `load`."""
        self._call(_tell, ("configure", config, dict(timing)))

    def _call(self, function, *args):
        """function(the worker process, *args); a failure closes the worker (WorkerError), and so does an interrupt
        (raised as it is), which may leave a frame half sent or a reply unread."""
        if self._process is None:
            raise WorkerError("the cycle model's worker process was closed")
        try:
            return function(self._process, *args)
        except (OSError, EOFError, ValueError, pickle.PickleError) as exc:
            self.close()
            raise WorkerError(f"the cycle model's worker process failed ({exc})") from None
        except BaseException:
            self.close()
            raise

    def load(self, programs: list) -> bool:
        """Gives the worker the cards' programs (one list of Decoded per card; True)."""
        self.programs = list(programs)
        instructions = [[decoded.inst for decoded in program] for program in programs]
        self._call(_tell, ("programs", instructions))
        return True

    def begin(self, pos: int, rows: int) -> bool:
        """Starts scheduling the run at (pos, rows) of the loaded programs (True)."""
        self._call(_tell, ("run", pos, rows))
        return True

    def finish(self) -> tuple:
        """The run's (report, variant reports), once the worker has scheduled it."""
        reply = self._call(_reply)
        if reply[0] != "report":
            self.close()
            raise WorkerError(f"the cycle model's worker process failed: {reply[1]}")
        return reply[1], reply[2]

    def abort(self) -> bool:
        """Drops the run under way (the functional run failed): its reply is read and discarded (True)."""
        self._call(_reply)
        return True

    def close(self) -> None:
        process, self._process = getattr(self, "_process", None), None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __del__(self):
        self.close()


def card_traces(programs: list, gathered: list, pos: int, rows: int) -> list:
    """Every card's trace of the run at (pos, rows) (programs: one list of Decoded per card), as the cards execute
    them: `trace_run` and the ALLGATHERs' slices, an ALLGATHER equal to the one at its pc in the card's last run given
    as that same object (gathered: one dict pc -> Resolved per card, kept across runs). Raises ValueError where the
    cards' ALLGATHERs do not meet (the functional run fails then too)."""
    traces = with_gather_slices([trace_run(program, card, pos, rows) for card, program in enumerate(programs)])
    for trace, memo in zip(traces, gathered):
        for pc, r in enumerate(trace):
            if r.op is Opcode.ALLGATHER:
                if memo.get(pc) == r:
                    trace[pc] = memo[pc]
                else:
                    memo[pc] = r
    return traces


def serve(incoming: BinaryIO, outgoing: BinaryIO) -> None:
    """The worker's loop: a configuration, then programs and runs, each run answered with its reports."""
    message = _receive(incoming)
    if message[0] != "configure":
        raise ValueError(f"expected the configuration first, got {message[0]!r}")
    _, config, timing = message
    programs, gathered = [], []
    while True:
        try:
            message = _receive(incoming)
        except EOFError:
            return
        if message[0] == "programs":
            programs = [[Decoded(inst) for inst in program] for program in message[1]]
            gathered = [{} for _ in programs]
            continue
        if message[0] != "run":
            raise ValueError(f"expected programs or a run, got {message[0]!r}")
        try:
            traces = card_traces(programs, gathered, message[1], message[2])
            report = schedule(traces, config)
            variants = {label: schedule(traces, other) for label, other in timing.items()}
        except ValueError as exc:
            _send(outgoing, ("error", str(exc)))
            continue
        _send(outgoing, ("report", report, variants))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the simulator's to handle; a closed pipe ends this
    try:
        serve(sys.stdin.buffer, sys.stdout.buffer)
    except BrokenPipeError:  # the simulator closed the worker while it answered (Python's docs, "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        sys.exit(1)
