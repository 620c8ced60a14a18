"""Format sniffing, loading and saving, over every shared fixture and bad inputs."""

from __future__ import annotations

import json

import pytest

from tests.topo.fixtures import all_fixture_names, fixture_path, fixture_text
from topocoll.errors import FormatError, TopologyError
from topocoll.topo.io import dumps_topology, load_topology, save_topology, sniff_format
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder


def expected_format(name: str) -> str | None:
    """What each fixture is, from the fixture README's tables (mirrored in the file names)."""
    if name.endswith(".nccl-topo.xml"):
        return "nccl-xml"
    if name.endswith(".nvidia-smi-topo.txt"):
        return "nvidia-smi"
    if name.endswith(".rocm-smi-showtopo.txt"):
        return "rocm-smi"
    return None  # graph file, nccl-tests results, busbw tables: not topologies


REFUSALS = {
    ".nccl-graph.xml": "NCCL graph file",
    ".all_reduce_perf.txt": "nccl-tests result",
    ".allreduce-busbw-table.txt": "bandwidth table",
}


@pytest.mark.parametrize("name", all_fixture_names())
def test_every_fixture_is_sniffed_or_refused(name):
    text = fixture_text(name)
    fmt = expected_format(name)
    if fmt is not None:
        assert sniff_format(text) == fmt
        topo = load_topology(fixture_path(name))
        assert topo.name == name
        return
    reason = next(why for suffix, why in REFUSALS.items() if name.endswith(suffix))
    with pytest.raises(FormatError, match=rf"^{name}: this is an? {reason}"):
        sniff_format(text, name)
    with pytest.raises(FormatError, match=reason):
        load_topology(fixture_path(name))


def test_sniff_json_and_unknown():
    assert sniff_format('  {"nodes": []}') == "json"
    with pytest.raises(FormatError, match=r"^f\.txt: cannot tell the format"):
        sniff_format("just some words\n", "f.txt")
    with pytest.raises(FormatError, match=r"root element <html>"):
        sniff_format("<html><body/></html>")


def small_topology() -> Topology:
    b = TopologyBuilder("small")
    b.add_node(Node("cpu0", NodeKind.CPU, numa=0))
    for i in range(2):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU, rank=i, numa=0, busid=f"0000:0{i + 1}:00.0"))
        b.add_link(f"gpu{i}", "cpu0", LinkKind.PCIE, 8e9 * 128 / 130 / 8 * 16)
    b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 50e9, count=2)
    return b.build()


@pytest.mark.parametrize("suffix", [".json", ".xml"])
def test_save_and_load_by_extension(tmp_path, suffix):
    topo = small_topology()
    path = tmp_path / f"out{suffix}"
    save_topology(topo, path)
    assert path.read_text() == dumps_topology(topo, "json" if suffix == ".json" else "nccl-xml")
    assert load_topology(path).to_json() == topo.to_json()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_json_to_json_is_identical(tmp_path):
    text = small_topology().to_json()
    path = tmp_path / "t.json"
    path.write_text(text)
    assert load_topology(path).to_json() == text


def test_bad_extension_writes_nothing(tmp_path):
    with pytest.raises(FormatError, match=r"out\.yaml: unknown output extension '\.yaml'"):
        save_topology(small_topology(), tmp_path / "out.yaml")
    assert list(tmp_path.iterdir()) == []


def test_unexportable_topology_writes_nothing(tmp_path):
    b = TopologyBuilder()
    for i in range(2):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU))
    b.add_link("gpu0", "gpu1", LinkKind.XGMI, 64e9)
    with pytest.raises(FormatError, match=r"x\.xml: link gpu0->gpu1 is xgmi"):
        save_topology(b.build(), tmp_path / "x.xml")
    assert list(tmp_path.iterdir()) == []


def test_missing_file_is_left_to_the_caller(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_topology(tmp_path / "absent.json")


def test_not_utf8(tmp_path):
    path = tmp_path / "bin.xml"
    path.write_bytes(b"<system>\xff\xfe</system>")
    with pytest.raises(FormatError, match=r"bin\.xml: not UTF-8 text"):
        load_topology(path)


# ------------------------------------------------------------------------- bad topology files


def json_topology(**changes) -> str:
    data = json.loads(small_topology().to_json())
    for key, value in changes.items():
        target, index, attr = key.split("__")
        data[target][int(index)][attr] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    "text, pattern",
    [
        ('{"nodes": [', r"line 1: malformed JSON"),
        (json_topology(links__0__bw_bytes_per_s=0), r"links\[0\] \(cpu0->gpu0\).*bw_bytes_per_s must be finite and > 0, got 0"),
        (json_topology(links__0__bw_bytes_per_s=-5), r"links\[0\].*must be finite and > 0, got -5"),
        (json_topology(links__0__bw_bytes_per_s="fast"), r"links\[0\].*bw_bytes_per_s must be a number, got 'fast'"),
        (json_topology(nodes__1__rank="one"), r"nodes\[1\] \(gpu0\).*rank must be an integer"),
        (json_topology(links__0__target="gpu9"), r"unknown endpoint 'gpu9'"),
        (json_topology(nodes__2__rank=0), r"rank 0 already used by node gpu0"),
        (json_topology(nodes__1__kind="tpu"), r"nodes\[1\] \(gpu0\): kind 'tpu' is not one of"),
    ],
)
def test_bad_json_one_line_error_naming_file(tmp_path, text, pattern):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises((TopologyError, FormatError), match=rf"^{path}: .*{pattern}") as info:
        load_topology(path)
    assert "\n" not in str(info.value)


def test_nan_bandwidth_in_json(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text(json_topology(links__0__bw_bytes_per_s=1.0).replace("1.0", "NaN", 1))
    with pytest.raises(TopologyError, match=rf"^{path}: NaN is not a valid number"):
        load_topology(path)


def test_disconnected_gpus_in_json(tmp_path):
    data = json.loads(small_topology().to_json())
    data["links"] = [l for l in data["links"] if l["kind"] != "nvlink" and "gpu1" not in (l["source"], l["target"])]
    path = tmp_path / "apart.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TopologyError, match=rf"^{path}: compute nodes are not connected: gpu1"):
        load_topology(path)


def test_malformed_inputs_of_each_text_format(tmp_path):
    cases = {
        "a.xml": ('<system version="1">\n<cpu>\n</system>\n', r"line 3: malformed XML"),
        "b.xml": ('<!DOCTYPE x [<!ENTITY a "aaaa">]>\n<system/>', r"line 1: <!DOCTYPE"),
        "c.txt": ("GPU0 GPU1 CPU Affinity\nGPU0 X NV4 0-3\nGPU1 NV4\n", r"line 3: row GPU1 has 1 cells"),
    }
    for name, (text, pattern) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(FormatError, match=rf"^{path}: {pattern}"):
            load_topology(path)
