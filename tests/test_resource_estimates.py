"""scripts/resource_estimates.py: the buffers' memory count at u280, by hand (no synthesis)."""
from ringgpt.hw.config import get_config


def test_buffer_copies_count_each_shared_group_once(load_script):
    buffers = load_script("resource_estimates").buffer_estimate(get_config("u280"))
    # a copy: 17 memories of 64-word rows, 1,024 bits = 15 URAM columns of 72 bits, one URAM deep
    # (ABUF 2 M words: 1,928 rows; WBUF 4 M: 3,856 rows of the URAM's 4,096)
    assert {name: (b["URAM_per_copy"], b["depth"]) for name, b in buffers.items()} == {"ABUF": (255, 1928),
                                                                                      "WBUF": (255, 3856)}
    # ABUF: the tile ports of the matrix unit (weights, x, bias) and the vector unit (its 3 operands) and the
    # SharedReadPorts of the on-chip DMA, the 33 engines' one store read and the router, all one read port per
    # memory; WBUF: the matrix unit's tile port
    assert (buffers["ABUF"]["copies"], buffers["WBUF"]["copies"]) == (1, 1)
    assert buffers["ABUF"]["read_ports"] == ["TileReadPort and SharedReadPort group of 5: " + ", ".join(sorted(
        ["dma.abuf_src", "dma.abuf_store", "matrix.abuf_tiles", "vector.abuf_src", "router.abuf_src"]))]
    # every write of the core one write port per memory: ABUF's the on-chip DMA's and the engines' rows and the
    # matrix unit's results and row maxima, the vector unit's, the router's; WBUF's the DMA's rows
    assert buffers["ABUF"]["write_ports"] == ["RowWritePort and SharedWritePort group of 38: " + ", ".join(sorted(
        ["dma.abuf_dst", "matrix.abuf_dst", "matrix.abuf_aux", "vector.abuf_dst", "router.abuf_dst"]
        + [f"dma.{port}_to_abuf" for port in [*(f"hbm{c}" for c in range(32)), "host"]]))]
    assert len(buffers["WBUF"]["write_ports"]) == 1
    assert buffers["ABUF"]["URAM"] + buffers["WBUF"]["URAM"] == 510


def test_port_logic_is_counted_per_requester(load_script):
    script = load_script("resource_estimates")
    assert [script._choice_luts(n) for n in (1, 2, 3, 4, 17, 35, 43)] == [0, 1, 1, 3, 7, 14, 18]
    ports = script.port_logic(get_config("u280"))
    # WBUF: the matrix unit's 17 weight and bias lanes, and a write group of the on-chip DMA's two-row port and the
    # 33 engines' one-row ports (35 candidate rows)
    assert ports["requesters"]["WBUF"] == {"tile lane of 64": 17, "row write of 128": 1, "row write of 64": 33}
    # a lane: two rows picked out of 17 memories (7 LUTs a bit of 1,024) and shifted to 64 words (3 stages a bit), two
    # kept rows of registers; each of 17 memories chooses its row (1,024 bits, 64 enables, 12 row bits) among 35
    lane = 2 * 1024 * 7 + 64 * 16 * 3
    assert ports["WBUF"]["LUT"] == 17 * lane + 17 * (1024 + 64 + 12) * 14
    assert ports["WBUF"]["FF"] == 17 * 2 * 1024
    assert ports["requesters"]["ABUF"]["row write of 64"] == 33 and ports["requesters"]["ABUF"]["shared read of 32"] == 1
