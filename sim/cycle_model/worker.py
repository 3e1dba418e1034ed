"""The cycle model's schedule in a second process, fed while the functional simulator runs.

`ScheduleWorker` (the simulator's side) sends each card's newly executed instructions at every point where the
cards synchronise (`push`) and the end of the run (`finish`, which returns the reports); the worker process
(`python -m ringgpt.sim.cycle_model.worker`) runs `schedule` on traces that grow as the blocks arrive, so the
schedule of a run overlaps its execution and only its tail is waited for. The reports are those of
`schedule(traces, cfg)` in the simulator's own process, field for field (tests/test_schedule_worker.py).

An instruction crosses the pipe once: both sides number the Resolved objects (a slot each), and an instruction the
simulator executes again with the same Resolved object (as it does while its registers are unchanged) is sent as its
slot, so the worker's schedule meets the same object again and reuses its derived costs (scheduler._costed).
Frames on the pipes: an 8-byte little-endian length, then a pickle.
"""
from __future__ import annotations

import pickle
import signal
import struct
import subprocess
import sys
from typing import BinaryIO

from ringgpt.hw.isa import Flags, Opcode, Space
from ringgpt.hw.resolved import Resolved

from .scheduler import schedule

_LENGTH = struct.Struct("<Q")
_OPCODES = {op._value_: op for op in Opcode}
_SPACES = {space._value_: space for space in Space}


def _encode(r: Resolved) -> tuple:
    """r in plain integers and tuples (pickled and unpickled several times faster than its enums)."""
    op, card, rows, n, k, pos, dst, src1, src2, aux, s0, s1, s2, s3, flags, slices = r
    return (op._value_, card, rows, n, k, pos, dst[0]._value_, dst[1], src1[0]._value_, src1[1], src2[0]._value_,
            src2[1], aux[0]._value_, aux[1], s0, s1, s2, s3, tuple(flags), slices)


def _decode(t: tuple) -> Resolved:
    spaces = _SPACES
    return Resolved(_OPCODES[t[0]], t[1], t[2], t[3], t[4], t[5], (spaces[t[6]], t[7]), (spaces[t[8]], t[9]),
                    (spaces[t[10]], t[11]), (spaces[t[12]], t[13]), t[14], t[15], t[16], t[17], Flags(*t[18]), t[19])


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


class WorkerError(RuntimeError):
    """The worker process failed or its pipe closed (the simulator then schedules in its own process)."""


class ScheduleWorker:
    """The simulator's end of a worker process that schedules its runs under `config` and every `timing` variant.

    Per run: `begin()`, `push(traces)` whenever more of the traces is known (each card's list of Resolved, grown
    since the last push), then `finish(traces)` for (report, {label: report}) or `abort()` when the run failed."""

    def __init__(self, config, timing: dict):
        self._process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
        self._slots: dict = {}
        """id(r) -> slot of every Resolved r the worker holds."""
        self._held: dict = {}
        """id(r) -> r for the same objects (alive, so that an id stays its object's)."""
        self._used: set = set()
        """The ids of the objects the run under way refers to."""
        self._dropped: list = []
        """The slots the worker may forget (objects the last finished run did not use), sent with the next run."""
        self._next_slot = 0
        self._sent: list = []
        """Per card: how many of its trace's entries have been sent in this run."""
        self._call(_send, self._process.stdin, ("configure", config, dict(timing)))

    def _call(self, function, *args):
        try:
            return function(*args)
        except (OSError, EOFError, ValueError, pickle.PickleError) as exc:
            self.close()
            raise WorkerError(f"the cycle model's worker process failed ({exc})") from None

    def begin(self, cards: int) -> bool:
        """Starts a run of `cards` cards (True)."""
        self._used = set()
        self._sent = [0] * cards
        self._call(_send, self._process.stdin, ("begin", self._dropped))
        self._dropped = []
        return True

    def push(self, traces: list) -> bool:
        """Sends what the cards executed since the last push (True)."""
        slots, new, blocks = self._slots, [], []
        for card, trace in enumerate(traces):
            entries = trace[self._sent[card]:]
            self._sent[card] = len(trace)
            keys = list(map(id, entries))
            block = list(map(slots.get, keys))
            if None in block:
                for index, slot in enumerate(block):
                    if slot is None:
                        r, key = entries[index], keys[index]
                        slot = slots.get(key)
                        if slot is None:  # (an object met twice in this block is sent once)
                            slot = slots[key] = self._next_slot
                            self._held[key] = r
                            self._next_slot += 1
                            new.append((slot, _encode(r)))
                        block[index] = slot
            self._used.update(keys)
            blocks.append(block)
        self._call(_send, self._process.stdin, ("entries", new, blocks))
        return True

    def finish(self, traces: list) -> tuple:
        """The rest of the traces, then the run's (report, variant reports); both sides forget the objects this run
        did not use."""
        self.push(traces)
        self._call(_send, self._process.stdin, ("end",))
        for key in self._slots.keys() - self._used:  # while the worker finishes the schedule
            self._dropped.append(self._slots.pop(key))
            del self._held[key]
        reply = self._call(_receive, self._process.stdout)
        if reply[0] != "report":
            self.close()
            raise WorkerError(f"the cycle model's worker process failed: {reply[1]}")
        return reply[1], reply[2]

    def abort(self) -> bool:
        """Drops the run under way (the functional run failed; True)."""
        self._call(_send, self._process.stdin, ("abort",))
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


class _Aborted(Exception):
    """The simulator dropped the run being scheduled."""


class _Run:
    """One run's traces as they arrive: each card's `_Trace` pulls the next frame from the pipe when it has
    scheduled every entry received so far."""

    def __init__(self, stream: BinaryIO, objects: dict, cards: int):
        self.stream, self.objects = stream, objects
        self.traces = [_Trace(self) for _ in range(cards)]
        self.ended = False

    def pull(self) -> None:
        message = _receive(self.stream)
        if message[0] == "entries":
            _, new, blocks = message
            self.objects.update((slot, _decode(t)) for slot, t in new)
            objects = self.objects
            for trace, block in zip(self.traces, blocks):
                trace.entries.extend([objects[slot] for slot in block])
        elif message[0] == "end":
            self.ended = True
        elif message[0] == "abort":
            raise _Aborted
        else:
            raise ValueError(f"unexpected message {message[0]!r} within a run")


class _Trace:
    """A card's trace (list-like for `schedule`: iteration and len) that grows from the pipe while iterated."""

    def __init__(self, run: _Run):
        self.run, self.entries = run, []

    def __iter__(self):
        entries, index = self.entries, 0
        while True:
            while index == len(entries):
                if self.run.ended:
                    return
                self.run.pull()
            yield entries[index]
            index += 1

    def __len__(self) -> int:
        return len(self.entries)


def serve(incoming: BinaryIO, outgoing: BinaryIO) -> None:
    """The worker's loop: a configuration, then runs, each scheduled as its traces arrive."""
    message = _receive(incoming)
    if message[0] != "configure":
        raise ValueError(f"expected the configuration first, got {message[0]!r}")
    _, config, timing = message
    objects: dict = {}
    while True:
        try:
            message = _receive(incoming)
        except EOFError:
            return
        if message[0] == "abort":
            continue
        if message[0] != "begin":
            raise ValueError(f"expected the start of a run, got {message[0]!r}")
        for slot in message[1]:
            del objects[slot]
        run = _Run(incoming, objects, config.cards)
        try:
            report = schedule(run.traces, config)
        except _Aborted:
            continue
        except ValueError as exc:
            try:
                while not run.ended:
                    run.pull()
            except _Aborted:
                continue
            _send(outgoing, ("error", str(exc)))
            continue
        while not run.ended:  # entries after every card's HALT (none from the simulator)
            run.pull()
        traces = [trace.entries for trace in run.traces]
        variants = {label: schedule(traces, other) for label, other in timing.items()}
        _send(outgoing, ("report", report, variants))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the simulator's to handle; a closed pipe ends this
    serve(sys.stdin.buffer, sys.stdout.buffer)
