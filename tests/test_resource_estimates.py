"""hw/resource_estimates.py (scripts/resource_estimates.py's estimates): the buffers' memory count at u280, by hand
(no synthesis)."""
from ringgpt.hw import resource_estimates as estimates
from ringgpt.hw.config import get_config


def test_buffer_copies_count_each_shared_group_once():
    buffers = estimates.buffer_estimate(get_config("u280"))
    # a copy: 17 memories of 64-word rows, 1,024 bits = 15 URAM columns of 72 bits, one URAM deep
    # (ABUF 2 M words: 1,928 rows; WBUF 4.25 M: all 4,096 rows of the URAM)
    assert {name: (b["URAM_per_copy"], b["depth"]) for name, b in buffers.items()} == {"ABUF": (255, 1928),
                                                                                      "WBUF": (255, 4096)}
    # ABUF: the tile ports of the matrix unit (x) and the vector unit (its 3 operands) and the
    # SharedReadPorts of the DMA (its on-chip copies' and the 33 engines' STOREs' one read) and the router, all one
    # read port per memory; WBUF: the matrix unit's tile port
    assert (buffers["ABUF"]["copies"], buffers["WBUF"]["copies"]) == (1, 1)
    assert buffers["ABUF"]["read_ports"] == ["TileReadPort and SharedReadPort group of 4: " + ", ".join(sorted(
        ["dma.abuf_src", "matrix.abuf_tiles", "vector.abuf_src", "router.abuf_src"]))]
    # every write of the core one write port per memory: ABUF's the on-chip DMA's rows, the engines' crossbar and
    # the matrix unit's results and row maxima, the vector unit's, the router's; WBUF's the DMA's rows
    assert buffers["ABUF"]["write_ports"] == ["RowWritePort and BankWritePort and SharedWritePort group of 6: " + ", ".join(
        sorted(["dma.abuf_dst", "dma.engines_to_abuf", "matrix.abuf_dst", "matrix.abuf_aux", "vector.abuf_dst",
                "router.abuf_dst"]))]
    assert len(buffers["WBUF"]["write_ports"]) == 1
    assert buffers["ABUF"]["URAM"] + buffers["WBUF"]["URAM"] == 510


def test_port_logic_is_composed_of_its_measured_parts():
    cfg = get_config("u280")
    # each part's LUTs stand in for Yosys's: select(n) n LUTs a bit (of SELECT_BITS), kept select(n) n + 1, a read
    # shift 1,000, a write shift 3,000
    asked = []

    def measure(name, build):
        asked.append(name)
        if name.startswith("select("):
            return {"LUT": int(name[7:-1]) * estimates.SELECT_BITS}
        if name.startswith("kept select("):        # the memories' rows and the kept one
            return {"LUT": (int(name[12:-1]) + 1) * estimates.SELECT_BITS}
        return {"LUT": 1000 if name.startswith("read shift") else 3000}

    ports = estimates.port_logic(cfg, measure)
    # WBUF: the matrix unit's 16 aligned weight lanes, its bias lane and its INT8 column scales' lane, and a write
    # group of the on-chip DMA's two-row port and the engines' crossbar (3 candidate rows)
    assert ports["requesters"]["WBUF"] == {"aligned tile lane of 64": 16, "tile lane of 64": 2, "row write of 128": 1,
                                           "bank write of 64": 1}
    # a lane: each of its two 1,024-bit rows selected among 17 memories or the kept row,
    # its words shifted out; an aligned lane: one row, no shift (its 64 words are the row); each of 17 memories
    # selects its row (1,024 bits, 64 enables, 12 row bits) among 3
    lane, aligned = 2 * 1024 * (17 + 1) + 1000, 1024 * (17 + 1)
    assert ports["WBUF"]["LUT"] == 16 * aligned + 2 * lane + 17 * (1024 + 64 + 12) * 3
    assert ports["WBUF"]["FF"] == 16 * 1024 + 2 * 2 * 1024
    # ABUF: the matrix unit's x lane and its aligned second x lane (INT8 weights), the vector unit's 3 lanes stepped
    # by special_lanes (16: one of 4 steps of a row, or one word of it), 2 shared reads (the DMA's, the router's:
    # their 2,048-bit pairs of rows); no weight lanes (the ISA puts every weight in WBUF);
    # the unit write: one of 4 shared writes (a 32-bit address, 64 words and 64 mask bits) shifted once, or the
    # on-chip DMA's two rows (2:1 over a chunk number and two rows with their enables); each of 17 memories selects
    # its row among the unit write's two and the crossbar's one (3 candidates)
    assert ports["requesters"]["ABUF"]["bank write of 64"] == 1 and ports["requesters"]["ABUF"]["shared read of 64"] == 2
    assert ports["requesters"]["ABUF"]["aligned tile lane of 64"] == 1
    assert ports["requesters"]["ABUF"]["tile lane of 64"] == 1 and ports["requesters"]["ABUF"]["stepped tile lane of 16"] == 3
    stepped = 1024 * (17 + 1) + 4 * 1024 + 64 * 16 + 16
    assert ports["ABUF"]["LUT"] == lane + aligned + 3 * stepped + 2 * (2 * 1024 * 17 + 1000) + 4 * (32 + 1024 + 64) + 3000 \
        + (32 + 2048 + 128) + 17 * (1024 + 64 + 11) * 3
    # the DMA's crossbar for both buffers: each of 17 memories selects a row, its enables and a 32-bit row address
    # among the 33 AXI ports' engines
    assert ports["crossbar"]["LUT"] == 17 * (1024 + 64 + 32) * 33
    assert {"select(17)", "select(3)", "select(4)", "select(33)", "read shift(64, 64)",
            "write shift(64, 64)"} <= set(asked)


def test_port_parts_are_the_buffers_own_logic():
    """The measured parts elaborate (to RTLIL, as Yosys reads them) from hw/core/buffers.py's select, words_at and
    placed."""
    from amaranth.back import rtlil
    parts = estimates.port_parts(get_config("sim-small"))
    assert {"select(5)", "read shift(8, 8)", "write shift(8, 1)"} <= set(parts)
    for name in ("select(5)", "read shift(8, 8)", "write shift(8, 1)"):
        assert "module" in rtlil.convert(parts[name](), name="top")


def test_reuse_compares_the_designs_digest():
    """--core --reuse takes a part's earlier figures only for the same design: the digest of its RTLIL is the same
    for two builds of one design and differs when the design changes."""
    from ringgpt.hw.core.transpose import TransposeTile
    assert estimates.design_digest(TransposeTile(4)) == estimates.design_digest(TransposeTile(4))
    assert estimates.design_digest(TransposeTile(4)) != estimates.design_digest(TransposeTile(8))
