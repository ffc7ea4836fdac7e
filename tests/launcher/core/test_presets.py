import pytest

from launcher.adapters.preset_files import load_preset, load_presets, make_shape
from launcher.core.errors import UserError
from launcher.core.presets import Shape, parse_preset, topology_error

BASE = {
    "name": "x",
    "accelerator": "tpu7x",
    "machine_type": "tpu7x-standard-4t",
    "topology": "4x4x4",
    "chips_per_host": 4,
    "devices_per_chip": 2,
    "peak_tflops_per_chip": 2307,
}


def test_required_presets_exist_and_facts_hold():
    presets = load_presets()
    for name in ("tpu7x-2x2x1", "tpu7x-4x4x4", "tpu7x-8x8x48"):
        assert name in presets
    assert {p.generation for p in presets.values()} >= {"tpu7x", "v6e", "v5p", "v4"}
    p = presets["tpu7x-4x4x4"]
    assert (p.chips, p.hosts, p.devices) == (64, 16, 128)
    assert p.placement_policy is None  # users name their workload policies: never assumed
    big = presets["tpu7x-8x8x48"]
    assert (big.chips, big.hosts, big.devices) == (3072, 768, 6144)
    v4 = presets["v4-8x8x48"]  # the seed launcher's 8x8x48 is a v4 pod slice
    assert (v4.chips, v4.hosts, v4.devices, v4.machine_type) == (3072, 768, 3072, "ct4p-hightpu-4t")
    single = presets["tpu7x-2x2x1"]
    assert (single.hosts, single.devices, single.multi_host) == (1, 8, False)
    assert presets["tpu7x-2x2x2"].multi_host


def test_every_preset_declares_its_notice_and_requests():
    for p in load_presets().values():
        assert p.notice_s == (15 if p.spot else 120), p.name
        assert set(p.requests()) == {"cpu", "memory"}


def test_multislice_of_a_single_host_preset_is_refused():
    with pytest.raises(UserError, match="multislice needs multi-host slices"):
        make_shape("tpu7x-2x2x1", 2)
    assert make_shape("tpu7x-2x2x1", 1).error is None and make_shape("tpu7x-2x2x2", 2).error is None


def test_shape_math():
    shape = Shape(load_preset("tpu7x-8x8x48"), 4)
    assert (shape.chips, shape.hosts, shape.devices) == (4 * 3072, 4 * 768, 4 * 6144)


@pytest.mark.parametrize(
    "gen,topology,ok",
    [
        ("tpu7x", "2x2x1", True),
        ("tpu7x", "2x4x4", True),
        ("tpu7x", "4x4x4", True),
        ("tpu7x", "8x8x48", True),  # 48 cubes <= 144
        ("tpu7x", "4x4x6", False),  # 6 is not a multiple of 4
        ("tpu7x", "8x4x4", False),  # not A <= B <= C
        ("tpu7x", "24x24x24", False),  # 216 cubes > 144
        ("v5p", "16x16x24", True),  # 96 cubes: the largest v5p slice
        ("v5p", "16x16x28", False),  # 112 cubes > 96
        ("v4", "8x4x4", True),  # v4 allows any order
        ("v4", "16x16x20", False),  # 80 cubes > 64
        ("v6e", "16x16", True),
        ("v6e", "4x16", False),
        ("v6e", "4x4x4", False),
        ("tpu7x", "4x4", False),
        ("tpu7x", "4xax4", False),
    ],
)
def test_topology_rules(gen, topology, ok):
    assert (topology_error(gen, topology) is None) is ok


@pytest.mark.parametrize(
    "change,message",
    [
        ({"colour": "blue"}, "unknown key"),
        ({"accelerator": "tpu-v9"}, "unknown accelerator"),
        ({"topology": "4x4x6"}, "multiple of 4"),
        ({"devices_per_chip": 1}, "2 JAX device(s) per chip"),
        ({"chips_per_host": 3}, "do not divide"),
        ({"chips_per_host": 0}, "positive integer"),
        ({"peak_tflops_per_chip": "fast"}, "positive number"),
        ({"fallbacks": "tpu7x-2x2x1"}, "list of preset names"),
        ({"spot": "yes"}, "true or false"),
        ({"termination_notice_s": 0}, "positive integer"),
        ({"placement_policy": ""}, "non-empty string"),
        ({"machine_type": "n2-standard-8"}, "give cpu_request and memory_request"),
    ],
)
def test_invalid_presets_are_refused(change, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_preset({**BASE, **change}, "x.yaml")


def test_missing_key(tmp_path):
    raw = dict(BASE)
    del raw["topology"]
    with pytest.raises(UserError, match=r"missing key.*topology"):
        parse_preset(raw, "x.yaml")


def _write(directory, name, **changes):
    doc = {**BASE, "name": name, **changes}
    lines = [f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in doc.items()]
    (directory / f"{name}.yaml").write_text(
        "\n".join(lines).replace("True", "true").replace("False", "false")
    )


def test_fallbacks_must_exist_and_be_smaller(tmp_path):
    _write(tmp_path, "big", fallbacks=["nowhere"])
    with pytest.raises(UserError, match="fallback 'nowhere' is not a known preset"):
        load_presets(tmp_path)
    other = tmp_path / "b"
    other.mkdir()
    _write(other, "small", topology="2x2x1")
    _write(other, "big", topology="2x2x2", fallbacks=["small"])
    _write(other, "bad", topology="2x2x1", fallbacks=["big"])
    with pytest.raises(UserError, match=r"fallback 'big' .* is not smaller"):
        load_presets(other)


def test_malformed_yaml_and_name_mismatch(tmp_path):
    (tmp_path / "broken.yaml").write_text("name: broken\ntopology: [4x4x4\n")
    with pytest.raises(UserError, match=r"broken.yaml: line .* malformed YAML"):
        load_presets(tmp_path)
    other = tmp_path / "o"
    other.mkdir()
    _write(other, "alpha")
    (other / "alpha.yaml").rename(other / "beta.yaml")
    with pytest.raises(UserError, match="does not match the file name"):
        load_presets(other)
