"""Spec database: every entry valid, dense and sourced; bad user files name the bad field;
the CPU ceiling follows its formula; OS parsing of cpuinfo and caches; the links table
(interconnects) is positive and sourced, devices name existing links."""

import copy
import json
import re

import pytest

from microbench import hardware, sysinfo

REQUIRED = ("H100 SXM", "H200 SXM", "B200", "MI300X", "MI355X", "TPU v5e", "TPU v5p",
            "TPU v6e", "TPU7x (Ironwood)", "Groq LPU", "Cerebras WSE-3", "Apple M4 Max")

GOOD = {"name": "My GPU", "vendor": "Me", "kind": "gpu", "dense": True,
        "peak_flops": {"bfloat16": 1e15, "float32": 5e13}, "memory_bandwidth": {"HBM": 2e12},
        "main_memory": "HBM", "memory_bytes": 8e10, "sources": ["my datasheet, p. 3"]}


def test_required_devices_present():
    names = hardware.list_devices()
    for name in REQUIRED:
        assert name in names
    assert "cpu" in names


@pytest.mark.parametrize("name", [n for n in hardware.list_devices() if n != "cpu"])
def test_every_entry_is_dense_sourced_and_consistent(name):
    dev = hardware.get(name)
    assert dev.dense is True
    assert dev.sources and all(len(s) > 20 for s in dev.sources)
    assert dev.main_memory in dev.memory_bandwidth
    assert dev.peak_flops and all(v > 0 for v in dev.peak_flops.values())
    # a bf16 tensor rate is never below the fp32 vector rate on these chips
    if "bfloat16" in dev.peak_flops and "float32" in dev.peak_flops:
        assert dev.peak_flops["bfloat16"] >= dev.peak_flops["float32"]


@pytest.mark.parametrize("name, ridge", [
    # ridge_flop_per_byte as tabulated in the reviewed reference sheet
    ("H100 SXM", 295.3), ("H200 SXM", 206.1), ("MI300X", 246.7), ("TPU v5e", 240.5),
    ("TPU v6e", 560.4), ("Groq LPU", 2.35), ("Cerebras WSE-3", 5.95), ("Apple M4 Max", 31.5),
])
def test_ridge_points_match_reference_table(name, ridge):
    assert hardware.ridge_point(hardware.get(name)) == pytest.approx(ridge, rel=2e-3)


def test_sram_only_chips_use_sram_as_main_memory():
    for name in ("Groq LPU", "Cerebras WSE-3"):
        assert hardware.get(name).main_memory == "SRAM"


def test_unknown_name_lists_valid_ones():
    with pytest.raises(KeyError) as err:
        hardware.get("H900")
    assert "H100 SXM" in str(err.value) and "TPU v5e" in str(err.value)


def test_load_device_round_trip(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(GOOD))
    dev = hardware.load_device(path)
    assert hardware.ridge_point(dev) == pytest.approx(500.0)
    hardware.add_device(dev)
    assert hardware.get("My GPU") == dev


@pytest.mark.parametrize("field, value, allowed", [
    ("kind", "fpga", "cpu | gpu"),
    ("dense", False, "dense peaks only"),
    ("peak_flops", [1e15], "an object"),
    ("peak_flops", {}, "at least one dtype"),
    ("peak_flops.bfloat16", -1.0, "positive number"),
    ("peak_flops.bfloat16", "fast", "positive number"),
    ("peak_flops.fp64", 1e13, "one of float32"),
    ("memory_bandwidth.HBM", 0, "positive number"),
    ("main_memory", "DRAM", "a key of memory_bandwidth"),
    ("memory_bytes", -5, "positive number"),
    ("sources", [], "citation"),
    ("name", "", "non-empty string"),
    ("vendor", None, "non-empty string"),
])
def test_bad_device_file_names_field_value_and_allowed(tmp_path, field, value, allowed):
    bad = copy.deepcopy(GOOD)
    keys = field.split(".")
    if len(keys) == 2:
        bad[keys[0]][keys[1]] = value
    else:
        bad[field] = value
    shown = keys[1] if keys[-1] == "fp64" else value  # an unknown dtype: the key is the value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError) as err:
        hardware.load_device(path)
    msg = str(err.value)
    assert f"'{field}'" in msg and repr(shown) in msg and allowed in msg


def test_not_json_is_value_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{name: 1")
    with pytest.raises(ValueError, match="not valid JSON"):
        hardware.load_device(path)


def test_cpu_ceiling_formula(monkeypatch):
    flags = {f: False for f in sysinfo.ISA_FLAGS} | {"avx2": True, "fma": True,
                                                      "avx512_vnni": True}
    monkeypatch.setattr(sysinfo, "isa_flags", lambda info=None: flags)
    monkeypatch.setattr(sysinfo, "affinity", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(sysinfo, "clock_hz", lambda: (3e9, "test"))
    hardware.cpu_device.cache_clear()
    try:
        dev = hardware.cpu_device()
    finally:
        hardware.cpu_device.cache_clear()
    # 4 cores x 2 FMA pipes x 8 lanes x 2 FLOP x 3 GHz; VNNI int8 at 4x; no bf16 instruction
    assert dev.peak_flops["float32"] == pytest.approx(4 * 2 * 8 * 2 * 3e9)
    assert dev.peak_flops["int8"] == pytest.approx(4 * dev.peak_flops["float32"])
    assert "bfloat16" not in dev.peak_flops
    assert dev.derivation["clock_source"] == "test"


@pytest.mark.parametrize("kind, name", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H200", "H200 SXM"),
    ("TPU v5 lite", "TPU v5e"), ("TPU v6 lite", "TPU v6e"), ("NVIDIA B200", "B200"),
    ("AMD Instinct MI300X", "MI300X"),
])
def test_device_for_environment(kind, name):
    assert hardware.device_for_environment({"backend": "gpu", "device_kind": kind}).name == name


def test_unknown_accelerator_has_no_spec():
    assert hardware.device_for_environment({"backend": "gpu", "device_kind": "Foo 9"}) is None


def test_read_cpuinfo_and_flags(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: Test CPU\ncpu family\t: 25\n"
                    "flags\t\t: fpu avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n")
    info = sysinfo.read_cpuinfo(path)
    assert sysinfo.cpu_model(info) == "Test CPU"
    assert sysinfo.cpu_family(info)["family"] == 25
    flags = sysinfo.isa_flags(info)
    assert flags["avx512f"] and flags["avx512_bf16"] and not flags["amx_bf16"]


def test_cache_sizes_from_sysfs_tree(tmp_path):
    for i, (level, kind, size, shared) in enumerate([
            (1, "Data", "32K", "0"), (1, "Instruction", "32K", "0"),
            (2, "Unified", "1024K", "0"), (3, "Unified", "32768K", "0-1")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size),
                           ("shared_cpu_list", shared)):
            (d / name).write_text(f"{text}\n")
    caches = sysinfo.cache_sizes(tmp_path)
    assert [(c["name"], c["size_bytes"]) for c in caches] == [
        ("L1", 32 << 10), ("L2", 1 << 20), ("L3", 32 << 20)]
    # two cores: private L1/L2 count twice, the shared L3 once
    assert sysinfo.aggregate_cache_bytes(caches, 2) == [
        ("L1", 64 << 10), ("L2", 2 << 20), ("L3", 32 << 20)]


# ---------------------------------------------------------------------------- links

GOOD_LINK = {"name": "My Link", "kind": "scale-up", "bandwidth": 1e11, "latency": 1e-6,
             "sources": ["my datasheet, p. 4"]}


def test_links_table_has_the_interconnects_the_simulator_needs():
    names = hardware.list_links()
    for name in ("NVLink 4", "NVLink 5", "PCIe 4.0 x16", "PCIe 5.0 x16",
                 "Infinity Fabric (MI300X)", "TPU v5e ICI", "TPU v5p ICI", "TPU v6e ICI",
                 "TPU7x ICI", "Groq C2C", "InfiniBand NDR"):
        assert name in names


@pytest.mark.parametrize("name", hardware.list_links())
def test_every_link_is_positive_sourced_and_noted(name):
    spec = hardware.get_link(name)
    assert spec.name == name and spec.kind in hardware.LINK_KINDS
    assert spec.bandwidth > 0 and spec.latency > 0
    assert spec.sources and all(len(s) > 20 for s in spec.sources)
    assert spec.notes  # every figure says where it comes from (derived / assumed)
    # per-message latencies are microsecond-scale, bandwidths between 1 GB/s and 10 TB/s
    assert 1e-8 < spec.latency < 1e-4 and 1e9 < spec.bandwidth < 1e13


@pytest.mark.parametrize("name", [n for n in hardware.list_devices() if n != "cpu"])
def test_device_links_exist(name):
    dev = hardware.get(name)
    links = hardware.list_links()
    if dev.scale_up is not None:
        assert dev.scale_up["link"] in links and dev.scale_up["chips"] >= 2
    if dev.scale_out is not None:
        assert dev.scale_out in links
    if dev.kind == "gpu":  # every GPU in the table has a scale-up and a scale-out link
        assert dev.scale_up is not None and dev.scale_out is not None


def test_nvlink4_is_half_the_bidirectional_datasheet_figure():
    h100 = " ".join(hardware.get("H100 SXM").sources)
    bidirectional = float(re.search(r"NVLink (\d+) GB/s", h100).group(1)) * 1e9
    assert bidirectional == 900e9
    assert hardware.get_link("NVLink 4").bandwidth == bidirectional / 2 == 450e9
    assert hardware.get("H100 SXM").scale_up == {"link": "NVLink 4", "chips": 8}
    assert hardware.get("GB200 (per GPU)").scale_up == {"link": "NVLink 5", "chips": 72}


def test_tpu_ici_is_halved_and_says_so():
    for name, per_direction in (("TPU v5e ICI", 200e9), ("TPU v5p ICI", 600e9),
                                ("TPU v6e ICI", 400e9), ("TPU7x ICI", 600e9)):
        spec = hardware.get_link(name)
        assert spec.bandwidth == per_direction
        assert any("halved" in n for n in spec.notes)


def test_assumed_latencies_are_labelled():
    for name in ("TPU v5e ICI", "Groq C2C", "400GbE RoCE"):
        assert any("assumed" in n for n in hardware.get_link(name).notes)


@pytest.mark.parametrize("field, value, allowed", [
    ("bandwidth", -1, "a finite positive number"),
    ("bandwidth", "fast", "a finite positive number"),
    ("latency", 0, "a finite positive number"),
    ("kind", "wifi", "scale-up | scale-out"),
    ("sources", [], "citation"),
    ("name", "", "non-empty string"),
])
def test_bad_link_names_field_value_and_allowed(field, value, allowed):
    bad = copy.deepcopy(GOOD_LINK) | {field: value}
    with pytest.raises(ValueError) as err:
        hardware.link_from_dict(bad, "links.NVLink 4.")
    msg = str(err.value)
    assert f"link field 'links.NVLink 4.{field}'" in msg
    assert repr(value) in msg and allowed in msg


def test_link_without_sources_is_refused():
    bad = {k: v for k, v in GOOD_LINK.items() if k != "sources"}
    with pytest.raises(ValueError, match="'sources'"):
        hardware.link_from_dict(bad)


def test_link_table_key_must_match_name():
    with pytest.raises(ValueError, match="'links.Other.name'"):
        hardware._links_from_table({"Other": GOOD_LINK})


@pytest.mark.parametrize("field, value, where, allowed", [
    ("scale_up", {"link": "NVLink 9", "chips": 8}, "scale_up.link", "NVLink 4"),
    ("scale_up", {"link": "NVLink 4", "chips": 1}, "scale_up.chips", "integer >= 2"),
    ("scale_up", {"link": "NVLink 4"}, "scale_up", "chips"),
    ("scale_out", "Carrier pigeon", "scale_out", "InfiniBand NDR"),
])
def test_device_with_unknown_link_is_value_error(tmp_path, field, value, where, allowed):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(GOOD | {field: value}))
    with pytest.raises(ValueError) as err:
        hardware.load_device(path)
    msg = str(err.value)
    assert f"'{where}'" in msg and allowed in msg and str(path) in msg


def test_device_links_round_trip(tmp_path):
    mine = GOOD | {"name": "My NVL GPU", "scale_up": {"link": "NVLink 5", "chips": 4},
                   "scale_out": "400GbE RoCE"}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(mine))
    dev = hardware.load_device(path)
    assert dev.scale_up == {"link": "NVLink 5", "chips": 4} and dev.scale_out == "400GbE RoCE"
    assert hardware.device_from_dict(dev.to_dict()) == dev
    for name in ("H100 SXM", "TPU v5e", "Apple M4 Max"):
        builtin = hardware.get(name)
        assert hardware.device_from_dict(builtin.to_dict()) == builtin


def test_unknown_link_lists_valid_ones():
    with pytest.raises(KeyError) as err:
        hardware.get_link("nope")
    assert "NVLink 4" in str(err.value) and "InfiniBand NDR" in str(err.value)


def test_link_converts_to_simulator_link():
    from refmodel.sim.cluster import Link

    spec = hardware.get_link("NVLink 4")
    sim = hardware.link(spec)
    assert isinstance(sim, Link)
    assert (sim.name, sim.bandwidth, sim.latency) == (spec.name, spec.bandwidth, spec.latency)
    assert sim.all_reduce(0, 8) == 0.0
    # a large ring all-reduce is bandwidth-bound: 2 (n-1)/n of the buffer over 450 GB/s
    assert sim.all_reduce(8e9, 8) == pytest.approx(2 * 7 / 8 * 8e9 / 450e9, rel=1e-3)
