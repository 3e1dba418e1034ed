"""Logic depth of a mapped UltraScale+ netlist (Yosys JSON after synth_xilinx), in LUT levels.

A path's depth counts its LUTs (LUT1-6, INV, a distributed RAM's or shift register's read), a carry chain as one
level however long (a CARRY4/8 entered from a carry output adds nothing), and MUXF7/8/9 as none (they sit behind
the LUTs of the same level in a CLB). A combinational DSP48E2 counts one level; a registered one, block RAMs,
UltraRAMs and flip-flops start and end paths.

`module_arcs` measures one module whose children are black boxes, at the granularity of ports: the deepest path
from the module's registers, each input port and each child's output port to its registers, each output port and
each child's input port. `compose` joins the arcs of every instance of a design along its hierarchy into
register-to-register depths across modules (a port's arcs stand for all its bits, so a composed figure is an upper
bound of the bit-level one).
"""
from __future__ import annotations

import heapq
from collections import defaultdict

SEQ = "seq"
"""An arc's end that is a register (or block RAM, UltraRAM, registered DSP) inside the module."""
REGISTERS, REGISTER_INPUTS = "<registers>", "<register inputs>"
"""The pins `compose` names an instance's registers by, where a path starts and ends."""

_FLOPS = {"FDRE", "FDSE", "FDCE", "FDPE", "FDRE_1", "FDSE_1", "FDCE_1", "FDPE_1", "LDCE", "LDPE"}
_CLOCKED = {"RAMB36E2", "RAMB18E2", "URAM288", "URAM288_BASE", "FIFO36E2", "FIFO18E2"}
_CARRY = {"CARRY4", "CARRY8"}
_WIDE_MUX = {"MUXF7", "MUXF8", "MUXF9"}
_READ_ADDRESS = ("A", "ADDR", "DPRA", "RADR")
"""Input pins of distributed RAMs and shift registers through which the output follows combinationally."""


def _is_lut_memory(kind: str) -> bool:
    return kind.startswith(("RAM32", "RAM64", "RAM128", "RAM256", "RAM512", "SRL"))


def _dsp_registered(params: dict) -> bool:
    return any(int(str(params.get(p, "0")), 2) if set(str(params.get(p, "0"))) <= {"0", "1"} else 0
               for p in ("PREG", "MREG"))


def _carry_bits(conns: dict, carry_out: set) -> list[tuple]:
    """A CARRY4/8 as one combinational cell per bit: O[i] and CO[i] follow S[0..i], DI[0..i] and the carry in
    (CI, CYINIT; CI_TOP from bit 4 of a CARRY8), a carry in from another carry's CO adding no level."""
    def bits(port):
        return conns.get(port, [])

    cells = []
    for i in range(len(bits("S"))):
        ins = bits("S")[:i + 1] + bits("DI")[:i + 1] + bits("CI") + bits("CYINIT") + (bits("CI_TOP") if i >= 4 else [])
        outs = [b for b in (bits("O")[i:i + 1] + bits("CO")[i:i + 1]) if isinstance(b, int)]
        cells.append(([(b, 0 if b in carry_out else 1) for b in ins if isinstance(b, int)], outs))
    return cells


class Netlist:
    """One module's mapped netlist as a graph of bits: combinational cells with a level weight per input pin,
    start points (register outputs) and end points (register inputs)."""

    def __init__(self, module: dict, children: set[str]):
        self.names: dict[int, str] = {}
        for name, net in module.get("netnames", {}).items():
            for index, bit in enumerate(net["bits"]):
                if isinstance(bit, int) and (bit not in self.names or not net.get("hide_name")):
                    label = name if len(net["bits"]) == 1 else f"{name}[{index}]"
                    if bit not in self.names or not name.startswith("$"):
                        self.names[bit] = label
        self.comb = []            # (inputs [(bit, weight)], outputs [bits])
        self.starts: list[int] = []          # bits driven by registers
        self.ends: list[int] = []            # bits read by registers
        self.pins_in: dict[tuple, list] = defaultdict(list)     # (child instance, port) -> bits it reads
        self.pins_out: dict[tuple, list] = defaultdict(list)    # (child instance, port) -> bits it drives
        carry_out = set()
        for cell in module["cells"].values():
            if cell["type"] in _CARRY:
                carry_out.update(b for b in cell["connections"].get("CO", []) if isinstance(b, int))
        for instance, cell in module["cells"].items():
            kind, conns, dirs = cell["type"], cell["connections"], cell.get("port_directions", {})
            ins = [(p, b) for p, bits in conns.items() if dirs.get(p) != "output" for b in bits if isinstance(b, int)]
            outs = [b for p, bits in conns.items() if dirs.get(p) == "output" for b in bits if isinstance(b, int)]
            if kind in children:
                for p, bits in conns.items():
                    into = self.pins_out if dirs.get(p) == "output" else self.pins_in
                    into[(instance, p)].extend(b for b in bits if isinstance(b, int))
            elif kind in _FLOPS or kind in _CLOCKED or (kind == "DSP48E2" and _dsp_registered(cell["parameters"])):
                self.starts += outs
                self.ends += [b for _, b in ins]
            elif _is_lut_memory(kind):
                self.starts += outs
                self.ends += [b for p, b in ins if not p.startswith(_READ_ADDRESS)]
                self.comb.append(([(b, 1) for p, b in ins if p.startswith(_READ_ADDRESS)], outs))
            elif kind in _WIDE_MUX:
                self.comb.append(([(b, 0) for _, b in ins], outs))
            elif kind in _CARRY:
                self.comb += _carry_bits(conns, carry_out)
            else:                                   # LUTs, INV, a combinational DSP, constants
                self.comb.append(([(b, 0 if kind in ("GND", "VCC") else 1) for _, b in ins], outs))
        self.ports_in = {p: [b for b in v["bits"] if isinstance(b, int)]
                         for p, v in module["ports"].items() if v["direction"] == "input"}
        self.ports_out = {p: [b for b in v["bits"] if isinstance(b, int)]
                          for p, v in module["ports"].items() if v["direction"] != "input"}
        self._order()

    def _order(self) -> None:
        """Topological order of the combinational cells (`rank`) and each bit's readers."""
        driver = {}
        for index, (_, outs) in enumerate(self.comb):
            for b in outs:
                driver[b] = index
        self.readers: dict[int, list] = defaultdict(list)
        for index, (ins, _) in enumerate(self.comb):
            for b, w in ins:
                self.readers[b].append((index, w))
        pending = [sum(1 for b, _ in ins if b in driver) for ins, _ in self.comb]
        ready = [i for i, n in enumerate(pending) if n == 0]
        self.rank = [-1] * len(self.comb)
        self.loop_breaks = 0
        order, unplaced = 0, 0
        while order < len(self.comb):
            if not ready:      # a structural loop (ABC leaves some through carry chains): enter it anywhere
                while self.rank[unplaced] >= 0 or pending[unplaced] <= 0:
                    unplaced += 1
                pending[unplaced] = 0
                ready.append(unplaced)
                self.loop_breaks += 1
            i = ready.pop()
            self.rank[i] = order
            order += 1
            for b in self.comb[i][1]:
                for j, _ in self.readers.get(b, ()):
                    pending[j] -= 1
                    if pending[j] == 0:
                        ready.append(j)

    def arrivals(self, sources: list[int]) -> tuple[dict[int, int], dict[int, int]]:
        """The deepest level at which each bit reachable from `sources` (level 0) settles, and each reached bit's
        predecessor on that path."""
        level = {b: 0 for b in sources}
        before: dict[int, int] = {}
        heap = []
        queued = set()

        def reach(bit):
            for j, _ in self.readers.get(bit, ()):
                if j not in queued:
                    queued.add(j)
                    heapq.heappush(heap, (self.rank[j], j))

        for b in sources:
            reach(b)
        while heap:
            _, i = heapq.heappop(heap)
            ins, outs = self.comb[i]
            best, via = -1, None
            for b, w in ins:
                if b in level and level[b] + w > best:
                    best, via = level[b] + w, b
            for b in outs:
                if best > level.get(b, -1):
                    level[b] = best
                    before[b] = via
                    reach(b)
        return level, before

    def path(self, bit: int, before: dict[int, int]) -> list[str]:
        """Names along the deepest path that ends at `bit`, from its start."""
        names = []
        while bit is not None:
            names.append(self.names.get(bit, f"${bit}"))
            bit = before.get(bit)
        return names[::-1]


def module_arcs(module: dict, children: set[str], deepest: int = 10) -> dict:
    """A module's arcs: {"arcs": [[from, to, levels]], "histogram": {levels: register inputs},
    "deepest": [{"levels", "from", "to"}], "loop_breaks"}, where from/to are SEQ, "in:port"/"out:port" or
    "cell:instance:port"; `loop_breaks` counts the structural loops entered without following them round (a path
    around one is counted once)."""
    net = Netlist(module, children)
    sinks = [(SEQ, net.ends)] + [(f"out:{p}", bits) for p, bits in net.ports_out.items()] + \
            [(f"cell:{i}:{p}", bits) for (i, p), bits in net.pins_in.items()]
    sources = [(SEQ, net.starts)] + [(f"in:{p}", bits) for p, bits in net.ports_in.items()] + \
              [(f"cell:{i}:{p}", bits) for (i, p), bits in net.pins_out.items()]
    arcs, histogram, paths = [], defaultdict(int), []
    for source, bits in sources:
        level, before = net.arrivals(bits)
        for sink, sink_bits in sinks:
            depths = [level[b] for b in sink_bits if b in level]
            if depths:
                arcs.append([source, sink, max(depths)])
        if source == SEQ:
            ends = sorted({b for b in net.ends if b in level}, key=lambda b: -level[b])
            for b in net.ends:
                if b in level:
                    histogram[level[b]] += 1
            for b in ends[:deepest]:
                trail = net.path(b, before)
                paths.append({"levels": level[b], "from": trail[0], "to": trail[-1]})
    return {"arcs": arcs, "histogram": dict(sorted(histogram.items())), "deepest": paths,
            "loop_breaks": net.loop_breaks}


def compose(instances: dict[str, str], arcs_of: dict[str, dict], children_of: dict[str, dict[str, str]],
            deepest: int = 10) -> dict:
    """Register-to-register depth across modules. `instances`: instance path -> module key; `arcs_of`: module key
    -> module_arcs(...); `children_of`: instance path -> {cell instance name in the module's netlist: child path}.
    The top's ports count as registers (the shell registers them). Returns the deepest paths, each with the pins
    it crosses, and `max_logic_levels`."""
    edges: dict[str, list] = defaultdict(list)
    start, end = "START", "END"

    def node(path: str, pin: str, incoming: bool) -> str:
        if pin == SEQ:
            return f"{path}:{REGISTERS if incoming else REGISTER_INPUTS}"
        kind, _, rest = pin.partition(":")
        if kind in ("in", "out"):
            if path == "top":
                return start if kind == "in" else end
            return f"{path}:{rest}"
        instance, _, port = rest.partition(":")
        return f"{children_of[path][instance]}:{port}"

    for path, key in instances.items():
        edges[start].append((f"{path}:{REGISTERS}", 0))
        edges[f"{path}:{REGISTER_INPUTS}"].append((end, 0))
        for source, sink, levels in arcs_of[key]["arcs"]:
            edges[node(path, source, True)].append((node(path, sink, False), levels))
    # longest paths from START over a graph that may have cycles at port granularity: relax in topological order
    # of its strongly connected components; a cycle (a port-level loop with no register) is reported, not followed
    best = {start: 0}
    before: dict[str, str] = {}
    order, loops = _topological(edges, start)
    for u in order:
        if u not in best:
            continue
        for v, w in edges.get(u, ()):
            if (u, v) in loops:
                continue
            if best[u] + w > best.get(v, -1):
                best[v], before[v] = best[u] + w, u
    finals = sorted(((best[u] + w, u) for u in best for v, w in edges.get(u, ()) if v == end), reverse=True)
    paths, seen = [], set()
    for levels, u in finals:
        trail = [u]
        while trail[-1] in before and before[trail[-1]] != start:
            trail.append(before[trail[-1]])
        trail.reverse()
        kinds = tuple(instances.get(pin.rpartition(":")[0], pin) for pin in (trail[0], trail[-1]))
        if kinds not in seen:       # one path per pair of modules: not the same one in each of 16 identical lanes
            seen.add(kinds)
            paths.append({"levels": levels, "through": trail})
        if len(paths) == deepest:
            break
    return {"max_logic_levels": finals[0][0] if finals else 0, "deepest": paths,
            "port_loops": sorted({f"{u} -> {v}" for u, v in loops})}


def _topological(edges: dict[str, list], start: str) -> tuple[list[str], set]:
    """An order of the nodes reachable from `start` in which every edge not in the returned back-edge set goes
    forward (iterative depth-first search)."""
    state: dict[str, int] = {}
    order, loops = [], set()
    stack = [(start, iter(edges.get(start, ())))]
    state[start] = 1
    while stack:
        u, it = stack[-1]
        for v, _ in it:
            if state.get(v) == 1:
                loops.add((u, v))
            elif v not in state:
                state[v] = 1
                stack.append((v, iter(edges.get(v, ()))))
                break
        else:
            stack.pop()
            state[u] = 2
            order.append(u)
    return order[::-1], loops
