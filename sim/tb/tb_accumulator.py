"""cocotb testbench of TileAccumulator(contexts): streams of tile sums for many independent
accumulations (1 to 12 tiles each) interleaved at random across the contexts, so that tiles of the
same sum often follow each other closely (the stall path) and far apart (the store path); tile
values mix normal numbers with random FP32 patterns (signed zeros, subnormals, Inf, NaN, near
overflow). Totals and contexts are bit-exact against numerics.add_in_order of each sum's tile
values, under random valid gaps and ready back-pressure; a round-robin stream over all contexts
runs at one tile per cycle."""
from collections import deque

import cocotb
import numpy as np

from ringgpt.hw import numerics as nx
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.tb import vectors


def tile_values(rng: np.random.Generator, n: int) -> np.ndarray:
    normal = nx.fp32_bits((rng.normal(0.0, 1.0, n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32))
    return np.where(rng.random(n) < 0.7, normal, vectors.random_fp32(rng, n)).astype(np.uint32)


def stream(order: list[int], sums: dict[int, deque]):
    """Packed input items, expected packed outputs and labels for tiles taken from `sums` (per
    context a queue of tile-value lists) in the context order `order`."""
    unit = bench.design()
    layout_i, layout_o = bench.payload_layout(unit, "i"), bench.payload_layout(unit, "o")
    items, expected, labels, position = [], [], [], {}
    for ctx in order:
        tiles = sums[ctx][0]
        k = position.get(ctx, 0)
        first, last = k == 0, k == len(tiles) - 1
        items.append(bench.pack(layout_i, {"data": tiles[k], "ctx": ctx, "first": first, "last": last}))
        labels.append((ctx, hex(tiles[k]), first, last))
        position[ctx] = k + 1
        if last:
            total = nx.fp32_bits(nx.add_in_order(nx.fp32_from_bits(np.array(tiles, np.uint32))))
            expected.append(bench.pack(layout_o, {"data": int(total), "ctx": ctx}))
            sums[ctx].popleft()
            position[ctx] = 0
    return labels, items, expected


def random_case(seed: int, accumulations: int, contexts: int):
    rng = np.random.default_rng(seed)
    sums = {ctx: deque() for ctx in range(contexts)}
    for _ in range(accumulations):
        length = int(min(12, rng.geometric(0.3)))
        sums[int(rng.integers(contexts))].append([int(v) for v in tile_values(rng, length)])
    order = [ctx for ctx, queue in sums.items() for tiles in queue for _ in tiles]
    rng.shuffle(order)   # any interleaving keeps each context's tiles in order
    return stream(order, sums)


def round_robin_case(seed: int, tiles: int, contexts: int):
    rng = np.random.default_rng(seed)
    sums = {ctx: deque([[int(v) for v in tile_values(rng, tiles)]]) for ctx in range(contexts)}
    return stream([ctx for _ in range(tiles) for ctx in range(contexts)], sums)


@cocotb.test()
async def bit_exact_under_backpressure(dut):
    args = bench.args()
    await bench.check_stream(dut, "add_in_order", *random_case(args["seed"], args["vectors"],
                                                                  bench.design().contexts), seed=args["seed"])


@cocotb.test()
async def round_robin_one_tile_per_cycle(dut):
    unit = bench.design()
    assert unit.contexts >= unit.loop_latency, "full rate needs at least loop_latency contexts"
    await bench.check_full_rate(dut, "add_in_order at full rate", *round_robin_case(7, 40, unit.contexts))
