"""The cocotb side of the testbench layer: the design under test as a Python object, clock and
reset, ready/valid stream sources and sinks with seeded random gaps and back-pressure, and payload
packing by Amaranth layouts.

All stream endpoints of a bench advance in one coroutine, once per clock cycle: at the falling edge
every endpoint drives its outputs (a source's valid and payload, a sink's ready), then, once the
signals have settled (ReadOnly), every endpoint samples the handshake that the next rising edge
will complete. Sampling after the drive makes combinational ready (for example one that depends on
the payload) safe.
"""
from __future__ import annotations

import functools
import json
import numbers
import os
import random
from typing import Iterable, Sequence

import cocotb
from amaranth.hdl import Shape
from amaranth.lib import data
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly, RisingEdge

from .runner import ARGS_ENV, DESIGN_ENV, Design

CLOCK_PERIOD_NS = 10


@functools.cache
def design():
    """The component under test, rebuilt from the Design the runner passed (for layouts and
    latency; the simulated netlist is its Verilog)."""
    return Design.from_json(os.environ[DESIGN_ENV]).instantiate()


def args() -> dict:
    """The testbench arguments the pytest side passed to run_testbench."""
    return json.loads(os.environ.get(ARGS_ENV, "{}"))


async def start(dut, *, reset_cycles: int = 2) -> None:
    """Starts the clock on `dut.clk` and holds `dut.rst` for `reset_cycles` cycles. Create the
    stream endpoints first: they drive valid/ready low, so nothing stale is taken out of reset."""
    Clock(dut.clk, CLOCK_PERIOD_NS, unit="ns").start()
    dut.rst.value = 1
    await ClockCycles(dut.clk, reset_cycles)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


def pack(layout, fields) -> int:
    """Packs a value laid out as `layout`: a dict of fields for a struct layout, a list of elements
    for an array layout, or an int (the raw bits, for any shape), nested as the layout is."""
    if isinstance(fields, dict):
        return sum(pack(layout[name].shape, value) << layout[name].offset for name, value in fields.items())
    if isinstance(layout, data.ArrayLayout) and not isinstance(fields, numbers.Integral):
        width = Shape.cast(layout.elem_shape).width
        return sum(pack(layout.elem_shape, item) << (index * width) for index, item in enumerate(fields))
    return int(fields) & ((1 << Shape.cast(layout).width) - 1)


def pack_lanes(words: Sequence[int], lane_bits: int) -> int:
    """Lanes of `lane_bits` bits each, lane 0 in the low bits (an ArrayLayout of plain lanes)."""
    value = 0
    for word in reversed(words):
        value = (value << lane_bits) | int(word)
    return value


class StreamSource:
    """Drives `items` (packed payload integers) into the stream `name` of `dut` (ports
    name__valid, name__ready, name__payload). Before each item it waits a random number of idle
    cycles: valid is raised with probability `valid_probability` per cycle; once raised, valid and
    payload hold until the handshake."""

    def __init__(self, dut, name: str, items: Iterable[int], *, valid_probability: float, rng: random.Random):
        self.valid = getattr(dut, f"{name}__valid")
        self.ready = getattr(dut, f"{name}__ready")
        self.payload = getattr(dut, f"{name}__payload")
        self.items = iter(items)
        self.probability = valid_probability
        self.rng = rng
        self.pending = next(self.items, None)
        self.presenting = False
        self.sent = 0
        self.valid_now = False
        self.valid.value = 0
        self.now = 0
        self.handshakes: list[int] = []
        """The cycle (run_streams' count) of each item's handshake."""

    @property
    def done(self) -> bool:
        return self.pending is None

    def drive(self) -> None:
        if self.presenting:
            return
        present = self.pending is not None and self.rng.random() < self.probability
        if present:
            self.payload.value = self.pending
        if present != self.valid_now:
            self.valid.value = int(present)
            self.valid_now = present
        self.presenting = present

    def sample(self) -> None:
        if self.presenting and self.ready.value:
            self.handshakes.append(self.now)
            self.sent += 1
            self.pending = next(self.items, None)
            self.presenting = False


class StreamSink:
    """Receives packed payload integers from the stream `name` of `dut` into `received`, raising
    ready with probability `ready_probability` per cycle (random back-pressure)."""

    def __init__(self, dut, name: str, *, expected: int, ready_probability: float, rng: random.Random):
        self.valid = getattr(dut, f"{name}__valid")
        self.ready = getattr(dut, f"{name}__ready")
        self.payload = getattr(dut, f"{name}__payload")
        self.expected = expected
        self.probability = ready_probability
        self.rng = rng
        self.received: list[int] = []
        self.ready_now = False
        self.ready.value = 0
        self.now = 0
        self.handshakes: list[int] = []
        """The cycle (run_streams' count) of each result's handshake."""

    @property
    def done(self) -> bool:
        return len(self.received) >= self.expected

    def drive(self) -> None:
        ready = self.rng.random() < self.probability
        if ready != self.ready_now:
            self.ready.value = int(ready)
            self.ready_now = ready

    def sample(self) -> None:
        if self.ready_now and self.valid.value:
            self.handshakes.append(self.now)
            self.received.append(self.payload.value.to_unsigned())


async def run_streams(dut, sources: Sequence[StreamSource], sinks: Sequence[StreamSink], *,
                      max_cycles: int) -> int:
    """Advances all endpoints cycle by cycle until every source is drained and every sink has its
    expected count; returns the number of cycles. Fails after `max_cycles` (a hung design)."""
    endpoints = list(sources) + list(sinks)
    falling, settled = FallingEdge(dut.clk), ReadOnly()
    for cycle in range(max_cycles):
        if all(ep.done for ep in endpoints):
            return cycle
        await falling
        for ep in endpoints:
            ep.drive()
        await settled
        for ep in endpoints:
            ep.now = cycle
            ep.sample()
    raise AssertionError(f"streams not done after {max_cycles} cycles: "
                         f"sent {[s.sent for s in sources]}, received {[len(s.received) for s in sinks]}")


def compare(name: str, inputs: Sequence, got: Sequence[int], expected: Sequence[int], *, show: int = 8) -> None:
    """Asserts `got` == `expected` element by element, listing the first mismatches with their
    inputs (hex)."""
    assert len(got) == len(expected), f"{name}: {len(got)} results for {len(expected)} inputs"
    bad = [k for k, (g, e) in enumerate(zip(got, expected)) if int(g) != int(e)]
    if bad:
        lines = [f"  input {inputs[k]!r}: got {int(got[k]):#x}, expected {int(expected[k]):#x}" for k in bad[:show]]
        raise AssertionError(f"{name}: {len(bad)} of {len(got)} results differ\n" + "\n".join(lines))
    cocotb.log.info("%s: %d results bit-exact", name, len(got))


def payload_layout(component, port: str):
    """The payload shape of stream port `port` ("i" or "o") of `component`."""
    return component.signature.members[port].signature.members["payload"].shape


async def _stream(dut, items: Sequence[int], *, expected: int, seed: int, valid_probability: float,
                  ready_probability: float):
    rng = random.Random(seed)
    source = StreamSource(dut, "i", items, valid_probability=valid_probability, rng=rng)
    sink = StreamSink(dut, "o", expected=expected, ready_probability=ready_probability, rng=rng)
    await start(dut)
    bound = 64 + 4 * int((len(items) + expected) / min(valid_probability, ready_probability))
    cycles = await run_streams(dut, [source], [sink], max_cycles=bound)
    return source, sink, cycles


async def stream_unit(dut, items: Sequence[int], *, expected: int, seed: int,
                      valid_probability: float = 0.7, ready_probability: float = 0.6) -> tuple[list[int], int]:
    """Resets `dut`, streams `items` into its `i` stream and collects `expected` results from its
    `o` stream, with random valid gaps and ready back-pressure from `seed`; returns the results
    and the number of cycles it took."""
    _, sink, cycles = await _stream(dut, items, expected=expected, seed=seed, valid_probability=valid_probability,
                                    ready_probability=ready_probability)
    return sink.received, cycles


async def check_stream(dut, name: str, inputs: Sequence, items: Sequence[int], expected: Sequence[int], *,
                       seed: int, valid_probability: float = 0.7, ready_probability: float = 0.6) -> None:
    """Streams `items` through the unit under random gaps and back-pressure and asserts its
    results equal `expected` (packed integers) one for one; `inputs` label mismatches."""
    got, _ = await stream_unit(dut, items, expected=len(expected), seed=seed,
                               valid_probability=valid_probability, ready_probability=ready_probability)
    compare(name, inputs, got, expected)


async def check_full_rate(dut, name: str, inputs: Sequence, items: Sequence[int], expected: Sequence[int]) -> None:
    """Streams `items` with valid and ready always high and asserts bit-exact results at full rate, measured
    against expectations that do not come from the run itself: every item is taken on consecutive cycles (one
    per cycle from the first), and the last result leaves exactly `latency` cycles (the design's stated
    pipeline depth) after the last item went in: not later (a slower pipeline), not earlier (a stated latency
    that the RTL does not have, which the schedulers built on it would then get wrong)."""
    latency = design().latency
    source, sink, _ = await _stream(dut, items, expected=len(expected), seed=0, valid_probability=1.0,
                                    ready_probability=1.0)
    compare(name, inputs, sink.received, expected)
    taken = source.handshakes
    assert taken == list(range(taken[0], taken[0] + len(items))), \
        f"{name}: items were not taken one per cycle at full rate (stalls at cycles " \
        f"{[c for a, c in zip(taken, taken[1:]) if c != a + 1][:8]})"
    measured = sink.handshakes[-1] - taken[-1]
    assert measured == latency, (f"{name}: the last result left {measured} cycles after the last item went in; "
                                 f"the design states latency {latency}")
