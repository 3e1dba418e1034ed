"""The architecture config: presets validate, derived values are right, invalid combinations and
config mismatches give clear errors."""
import dataclasses

import pytest

from ringgpt.hw.config import PRESETS, ConfigError, ConfigMismatchError, get_config


def test_u280_preset_derived_values():
    cfg = get_config("u280", cards=4)
    assert cfg.name == "u280-x4" and cfg.cards == 4
    assert cfg.macs_per_cycle == 16 * 64
    assert cfg.hbm_bytes == 8 * 2 ** 30
    assert cfg.hbm_port_gbps == pytest.approx(32 * 64 * 250e6 / 1e9)
    # The ports (512 GB/s at 250 MHz) exceed the physical peak, so streams are bound by 460 GB/s.
    assert cfg.hbm_sustained_gbps == pytest.approx(460 * 0.9)
    assert cfg.hbm_bytes_per_cycle == pytest.approx(460e9 * 0.9 / 250e6)
    assert cfg.peak_gflops == pytest.approx(2 * 1024 * 0.25)  # 2 flops per MAC at 0.25 GHz
    # the hop's physical parts (400 ns PHY + 5 ns cable + 8 CDC cycles = 437 ns) at 250 MHz; the router's own
    # cycles come from the RTL (hw/core/router.py), not from the config
    assert cfg.ring_latency_cycles == 109


def test_names_and_card_suffix():
    assert get_config("sim-small-x2").cards == 2
    assert get_config("u280").name == "u280-x1"
    assert get_config("u280-x1").with_cards(3).name == "u280-x3"
    with pytest.raises(ConfigError, match="unknown architecture config 'v100'; presets: sim-small, u280"):
        get_config("v100")
    with pytest.raises(ConfigError, match="bad card-count suffix"):
        get_config("u280-xfour")


def test_hash_tracks_every_field():
    cfg = PRESETS["u280"]
    assert cfg.hash == get_config("u280").hash
    assert dataclasses.replace(cfg, clock_mhz=251.0).hash != cfg.hash
    assert cfg.with_cards(2).hash != cfg.hash


@pytest.mark.parametrize("change, message", [
    ({"cards": 5}, "cards must be 1..4, got 5"),
    ({"cards": 0}, "cards must be 1..4, got 0"),
    ({"mac_width": 48}, "mac_width must be a power of two, got 48"),
    ({"mpu_lanes": 0}, "mpu_lanes must be a power of two, got 0"),
    ({"vector_width": 12}, "vector_width must be a power of two, got 12"),
    ({"hbm_efficiency": 1.5}, r"hbm_efficiency must be in \(0, 1\], got 1.5"),
    ({"hbm_port_bits": 100}, "hbm_port_bits must be a positive multiple of 16"),
    ({"wbuf_words": 1000}, "wbuf_words must be even and hold two slots"),
    ({"clock_mhz": 0}, "clock_mhz must be positive"),
    ({"hbm_channel_mbytes": 2 ** 20}, "HBM must be addressable in 32-bit word addresses"),
])
def test_invalid_configs(change, message):
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(PRESETS["u280"], **change)


def test_check_artifact():
    cfg = get_config("u280", 4)
    cfg.check_artifact("program", cfg.name, cfg.hash)
    other = get_config("sim-small", 4)
    with pytest.raises(ConfigMismatchError, match=r"program was built for config 'sim-small-x4' .* rebuild it for 'u280-x4'"):
        cfg.check_artifact("program", other.name, other.hash)


def test_sim_small_preset_derived_values():
    """Worked out by hand from the preset's figures (4 x 8 MACs, 4 x 64 MiB HBM at 128 bits, 100 MHz)."""
    cfg = get_config("sim-small", cards=2)
    assert cfg.name == "sim-small-x2" and cfg.cards == 2
    assert cfg.macs_per_cycle == 32 and cfg.peak_gflops == pytest.approx(6.4)
    assert cfg.hbm_bytes == 256 * 2 ** 20 and cfg.hbm_words == 128 * 2 ** 20
    assert cfg.hbm_port_gbps == pytest.approx(6.4)  # 4 ports x 16 bytes x 100 MHz
    assert cfg.hbm_sustained_gbps == pytest.approx(5.76) and cfg.hbm_bytes_per_cycle == pytest.approx(57.6)
    assert cfg.ring_bytes_per_cycle == pytest.approx(121.0) and cfg.ring_latency_cycles == 34  # (260 + 5 + 80) ns at 100 MHz
    assert dataclasses.replace(cfg, name="sim-small-x1", cards=1) == PRESETS["sim-small"]


@pytest.mark.parametrize("name, cards, message", [
    ("u280-x9", None, "bad card-count suffix in 'u280-x9'"),
    ("u280-x0", None, "bad card-count suffix"),
    ("u280-x4", 1, "names 4 card\\(s\\) but 1 were asked for"),
    ("u280", 0, "cards must be 1..4, got 0"),
    ("u280", 5, "cards must be 1..4, got 5"),
    ("u280", True, "cards must be 1..4"),
])
def test_contradictory_card_counts(name, cards, message):
    with pytest.raises(ConfigError, match=message):
        get_config(name, cards)
    assert get_config("u280-x2", 2).cards == 2


def test_config_is_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["u280"].cards = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["sim-small"].mac_width = 16  # type: ignore[misc]
