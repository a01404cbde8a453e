"""This machine's theoretical FLOP/cycle (microbench.hardware) comes from the datapath table,
not from the widest advertised vector: Zen 3 and Zen 4 execute 512-bit work on 256-bit pipes
(Zen 3 has no AVX-512 at all; a VM may still advertise it), Zen 5 server parts have the full
512-bit datapath, Intel parts are told apart by model number and, where a VM's model number
misleads, by their flags; a part not in the table is labelled an upper bound. All on fake cpu
ids and a fake /proc/cpuinfo, never the real one. The measured clock's two chains must agree."""

import pytest

from microbench import hardware, sysinfo

AMD = "AuthenticAMD"
AVX2 = "fpu sse sse2 avx avx2 fma f16c"
AVX512 = AVX2 + " avx512f avx512bw avx512vl avx512_bf16 avx512_vnni"


def flags(line: str) -> dict[str, bool]:
    return sysinfo.isa_flags({"flags": line})


@pytest.mark.parametrize("family, model, name", [
    (0x17, 0x01, "Zen / Zen+"), (0x17, 0x31, "Zen 2"), (0x19, 0x01, "Zen 3 (Milan)"),
    (0x19, 0x21, "Zen 3 (client)"), (0x19, 0x11, "Zen 4 (Genoa)"), (0x19, 0x61, "Zen 4"),
    (0x1A, 0x02, "Zen 5 (Turin)"), (0x1A, 0x44, "Zen 5 (desktop)"),
    (0x1A, 0x24, "Zen 5 (mobile)"),
])
def test_microarchitecture_lookup(family, model, name):
    arch = hardware.microarchitecture({"vendor": AMD, "family": family, "model": model})
    assert arch is not None and arch["name"] == name
    assert arch["source"]  # every entry cites its guide


INTEL = "GenuineIntel"
SPR = AVX512 + " avx512_fp16 amx_tile amx_bf16 amx_int8"


@pytest.mark.parametrize("model, flag_line, name, per_cycle", [
    (0x55, AVX512, "Skylake-SP / Cascade Lake", 64),
    (0x6A, AVX512, "Ice Lake-SP", 64),
    (0x8F, SPR, "Sapphire / Emerald / Granite Rapids", 64),
    (0xA7, AVX512, "Ice Lake / Tiger Lake / Rocket Lake (client)", 32),
    (0x9E, AVX2, "Haswell to Comet Lake", 32),
    # a VM that reports Rocket Lake's model with a server part's AMX: the flags decide
    (0xA7, SPR, "Sapphire Rapids or later (identified by its AMX tiles)", 64),
    (0x01, SPR, "Sapphire Rapids or later (identified by its AMX tiles)", 64),
])
def test_intel_parts_by_model_and_flags(model, flag_line, name, per_cycle):
    cpu_id = {"vendor": INTEL, "family": 6, "model": model}
    assert hardware.microarchitecture(cpu_id, flags(flag_line))["name"] == name
    got, why, known = _f32_per_cycle(flag_line, 6, model, vendor=INTEL)
    assert (got, known) == (per_cycle, True)
    contradicted = any("a VM's model number" in w for w in why)
    assert contradicted == (model == 0xA7 and "amx_tile" in flag_line)


def test_intel_model_without_its_flags_is_unknown():
    # Skylake-SP's model number on a part without AVX-512 is no Skylake-SP we know of; neither
    # is an Intel part with no AMX and a model number outside the table
    assert hardware.microarchitecture({"vendor": INTEL, "family": 6, "model": 0x3C},
                                      flags(AVX512)) is None
    assert hardware.microarchitecture({"vendor": INTEL, "family": 6, "model": 0x01},
                                      flags(AVX512)) is None


@pytest.mark.parametrize("add_hz, mul_hz, agreed", [
    (2.58e9, 2.57e9, 2.58e9),
    (10.4e9, 2.6e9, None),  # an add chain folded at rename: no clock claimed
    (2.0e9, 2.3e9, None),
    (0.0, 2.0e9, None),
])
def test_measured_clock_needs_both_chains_to_agree(add_hz, mul_hz, agreed):
    assert sysinfo._agreed_clock(add_hz, mul_hz) == agreed


@pytest.mark.parametrize("cpu_id", [
    {"vendor": INTEL, "family": 0x19, "model": 0x01},  # right numbers, wrong vendor
    {"vendor": AMD, "family": 0x19, "model": None},
    {"vendor": AMD, "family": 0x19, "model": 0xB0},  # past every Zen 3/4 range
    {"vendor": AMD, "family": 0x15, "model": 0x01},
    {},
])
def test_unknown_parts_are_not_in_the_table(cpu_id):
    assert hardware.microarchitecture(cpu_id) is None


def _f32_per_cycle(flag_line, family, model, vendor=AMD):
    pipes, lanes, why, known = hardware._datapath(
        flags(flag_line), {"vendor": vendor, "family": family, "model": model})
    return pipes * lanes * 2, why, known


def test_zen3_is_two_256_bit_pipes_even_with_avx512f_advertised():
    per_cycle, why, known = _f32_per_cycle(AVX512, 25, 1)
    assert per_cycle == 32 and known
    assert any("Zen 3" in w and "256-bit" in w for w in why)
    assert _f32_per_cycle(AVX2, 25, 1)[0] == 32


def test_zen4_executes_avx512_as_two_halves():
    per_cycle, why, known = _f32_per_cycle(AVX512, 25, 0x11)
    assert per_cycle == 32 and known
    assert any("two 256-bit halves" in w for w in why)


def test_zen5_server_has_the_full_512_bit_datapath():
    per_cycle, _, known = _f32_per_cycle(AVX512, 26, 2)
    assert per_cycle == 64 and known
    # without avx512f the advertised vector caps it: 2 x 8 lanes
    assert _f32_per_cycle(AVX2, 26, 2)[0] == 32
    # the mobile parts run 512-bit ops on 256-bit pipes
    assert _f32_per_cycle(AVX512, 26, 0x24)[0] == 32


def test_unknown_part_assumes_the_widest_vector_and_says_upper_bound():
    per_cycle, why, known = _f32_per_cycle(AVX512, 6, 0x01, vendor="GenuineIntel")
    assert per_cycle == 64 and not known
    assert any("upper bound" in w for w in why)
    assert _f32_per_cycle("asimd fp", None, None, vendor=None)[0] == 16  # 2 x 4 NEON lanes


def _fake_cpuinfo(monkeypatch, vendor, family, model, flag_line, cores=4, hz=3e9):
    info = {"vendor_id": vendor, "cpu family": str(family), "model": str(model),
            "model name": "Fake CPU", "flags": flag_line}
    monkeypatch.setattr(sysinfo, "read_cpuinfo", lambda path="/proc/cpuinfo": dict(info))
    monkeypatch.setattr(sysinfo, "affinity", lambda: list(range(cores)))
    monkeypatch.setattr(sysinfo, "clock_hz", lambda: (hz, "test clock"))


@pytest.fixture
def fresh_cpu_device():
    hardware.cpu_device.cache_clear()
    yield hardware.cpu_device
    hardware.cpu_device.cache_clear()


@pytest.mark.parametrize("family, model, per_cycle, arch", [
    (25, 1, 32, "Zen 3 (Milan)"), (25, 0x11, 32, "Zen 4 (Genoa)"), (26, 2, 64, "Zen 5 (Turin)"),
])
def test_cpu_device_on_known_amd_parts(monkeypatch, fresh_cpu_device, family, model, per_cycle,
                                       arch):
    _fake_cpuinfo(monkeypatch, AMD, family, model, AVX512)
    dev = fresh_cpu_device()
    d = dev.derivation
    assert d["flop_per_cycle_per_core"]["float32"] == per_cycle
    assert dev.peak_flops["float32"] == pytest.approx(4 * per_cycle * 3e9)
    assert d["microarchitecture"] == arch and d["bound"] == "theoretical peak"
    assert d["cpu_id"] == {"vendor": AMD, "family": family, "model": model}
    # bf16 via AVX512-BF16 is 2x the f32 rate of the same datapath, VNNI int8 4x
    assert dev.peak_flops["bfloat16"] == pytest.approx(2 * dev.peak_flops["float32"])
    assert dev.peak_flops["int8"] == pytest.approx(4 * dev.peak_flops["float32"])
    assert any("Optimization Guide" in s for s in dev.sources)
    assert dev.vendor == AMD


def test_cpu_device_on_an_unknown_part_is_an_upper_bound(monkeypatch, fresh_cpu_device):
    _fake_cpuinfo(monkeypatch, "GenuineIntel", 6, 0x01, AVX512, cores=2, hz=2e9)
    dev = fresh_cpu_device()
    assert dev.derivation["bound"].startswith("upper bound")
    assert dev.derivation["microarchitecture"] is None
    assert any("Upper bound" in n for n in dev.notes)
    assert dev.peak_flops["float32"] == pytest.approx(2 * 64 * 2e9)
