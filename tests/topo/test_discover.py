"""Host discovery (NVML mocked at the pynvml boundary, sysfs as a fake tree) and the flat fallback."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from topocoll.errors import TopologyError
from topocoll.topo import discover
from topocoll.topo.discover import discover_host, flat_topology, normalize_busid
from topocoll.topo.model import LinkKind, NodeKind

GB = 1e9


# ------------------------------------------------------------------------------ flat
def test_flat_topology_shape():
    topo = flat_topology(4)
    assert topo.compute_nodes() == ("host0", "host1", "host2", "host3")
    assert [topo.node(f"host{i}").rank for i in range(4)] == [0, 1, 2, 3]
    assert all(topo.node(f"host{i}").kind is NodeKind.HOST for i in range(4))
    hub = topo.node("hub")
    assert hub.kind is NodeKind.CPU
    assert len(topo.links) == 8
    for i in range(4):
        for a, b in ((f"host{i}", "hub"), ("hub", f"host{i}")):
            assert topo.link(a, b).kind is LinkKind.SHM
    assert topo.notes  # says that the figures are assumed


def test_flat_default_bandwidth_is_nccl_pci_figure_and_overridable():
    # NCCL src/graph/topo.h: PCI_BW 12.0 (GB/s), its figure for paths through host memory
    assert flat_topology(2).link("host0", "hub").bw_bytes_per_s == 12 * GB
    topo = flat_topology(3, bw_bytes_per_s=3.5 * GB, latency_s=2e-6)
    assert {(l.bw_bytes_per_s, l.latency_s) for l in topo.links} == {(3.5 * GB, 2e-6)}


def test_flat_single_rank_and_errors():
    assert flat_topology(1).compute_nodes() == ("host0",)
    with pytest.raises(TopologyError, match="world_size"):
        flat_topology(0)
    with pytest.raises(TopologyError, match="world_size"):
        flat_topology(True)
    with pytest.raises(TopologyError, match="bw_bytes_per_s"):
        flat_topology(2, bw_bytes_per_s=float("nan"))
    with pytest.raises(TopologyError, match="latency_s"):
        flat_topology(2, latency_s=-1.0)


# ------------------------------------------------------------------------- fake NVML
class _NVMLError(Exception):
    pass


def _fake_nvml(gpus: list[dict], *, init_error: bool = False) -> types.ModuleType:
    """A stand-in for the pynvml module: GPUs described as dicts (busid, links, cc, gen, width)."""
    module = types.ModuleType("pynvml")
    module.NVMLError = _NVMLError
    module.NVML_FEATURE_ENABLED = 1
    module.NVML_FEATURE_DISABLED = 0
    module.NVML_NVLINK_MAX_LINKS = 18
    module.calls = []

    def init():
        module.calls.append("init")
        if init_error:
            raise _NVMLError("Driver Not Loaded")

    def pci(busid: str):
        return types.SimpleNamespace(busId=busid.encode())

    def link_entry(handle, link):
        links = gpus[handle]["links"]
        if link >= len(links):
            raise _NVMLError("Not Supported")
        return links[link]

    def state(handle, link):
        remote = link_entry(handle, link)
        return 0 if remote is None else 1

    def remote_pci(handle, link):
        remote = link_entry(handle, link)
        if remote is None:
            raise _NVMLError("Not Supported")
        return pci(remote)

    def not_supported(*_):
        raise _NVMLError("Not Supported")

    module.nvmlInit = init
    module.nvmlShutdown = lambda: module.calls.append("shutdown")
    module.nvmlDeviceGetCount = lambda: len(gpus)
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetPciInfo = lambda h: pci(gpus[h]["busid"])
    module.nvmlDeviceGetName = lambda h: gpus[h].get("name", "Tesla V100-SXM2-16GB")
    module.nvmlDeviceGetCudaComputeCapability = lambda h: gpus[h]["cc"] if gpus[h].get("cc") else not_supported()
    module.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: gpus[h]["gen"] if gpus[h].get("gen") else not_supported()
    module.nvmlDeviceGetMaxPcieLinkWidth = lambda h: gpus[h]["width"] if gpus[h].get("width") else not_supported()
    module.nvmlDeviceGetNvLinkState = state
    module.nvmlDeviceGetNvLinkRemotePciInfo = remote_pci
    return module


def _sysfs(root: Path, numa: dict[str, int]) -> Path:
    for busid, node in numa.items():
        device = root / "bus" / "pci" / "devices" / busid
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{node}\n")
    return root


BUS = ["00000000:07:00.0", "00000000:0A:00.0", "00000000:85:00.0", "00000000:89:00.0"]
SYSFS_BUS = ["0000:07:00.0", "0000:0a:00.0", "0000:85:00.0", "0000:89:00.0"]


def _four_v100() -> list[dict]:
    # gpu0-gpu1 one link, gpu0-gpu2 two links, gpu1-gpu3 one link, gpu2-gpu3 two links;
    # one disabled link on gpu3; each GPU reports its own end of every link
    wiring = {0: [1, 2, 2], 1: [0, 3], 2: [0, 0, 3, 3], 3: [1, 2, 2, None]}
    return [
        {"busid": BUS[g], "links": [None if r is None else BUS[r] for r in remotes], "cc": (7, 0), "gen": 3, "width": 16}
        for g, remotes in wiring.items()
    ]


def test_discover_reads_gpus_nvlinks_pcie_and_numa(monkeypatch, tmp_path):
    fake = _fake_nvml(_four_v100())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sysfs = _sysfs(tmp_path, dict(zip(SYSFS_BUS, [0, 0, 1, 1])))
    topo = discover_host(sysfs_root=sysfs, host_id="nodeA")
    assert topo is not None
    assert fake.calls == ["init", "shutdown"]
    assert topo.compute_nodes() == ("gpu0", "gpu1", "gpu2", "gpu3")
    for g in range(4):
        node = topo.node(f"gpu{g}")
        assert (node.rank, node.busid, node.numa, node.host_id) == (g, SYSFS_BUS[g], [0, 0, 1, 1][g], "nodeA")
    per_link = 25 * GB  # NVLink 2 (compute capability 7.0): 300 GB/s over 6 links, both ways
    expected = {("gpu0", "gpu1"): 1, ("gpu0", "gpu2"): 2, ("gpu1", "gpu3"): 1, ("gpu2", "gpu3"): 2}
    nvlinks = {(l.src, l.dst): l for l in topo.links if l.kind is LinkKind.NVLINK}
    assert len(nvlinks) == 2 * len(expected)
    for (a, b), count in expected.items():
        for link in (nvlinks[a, b], nvlinks[b, a]):
            assert link.count == count
            assert link.bw_bytes_per_s == pytest.approx(count * per_link)
    # PCIe Gen3 x16 to the CPU of the GPU's NUMA node: 8 GT/s * 128/130 * 16 lanes / 8 bits
    assert topo.link("gpu2", "cpu1").bw_bytes_per_s == pytest.approx(8e9 * 128 / 130 * 16 / 8)
    assert topo.link("gpu0", "cpu0").kind is LinkKind.PCIE
    assert topo.link("cpu0", "cpu1").kind is LinkKind.SMP
    assert not topo.nodes_of(NodeKind.NVSWITCH)


def test_discover_nvswitch_remote_ends(monkeypatch, tmp_path):
    switches = ["00000000:C1:00.0", "00000000:C2:00.0"]
    gpus = [
        {"busid": BUS[g], "links": [switches[0]] * 2 + [switches[1]] * 2, "cc": (9, 0), "gen": 5, "width": 16, "name": "NVIDIA H100 80GB HBM3"}
        for g in range(2)
    ]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(gpus))
    topo = discover_host(sysfs_root=_sysfs(tmp_path, {SYSFS_BUS[0]: 0, SYSFS_BUS[1]: 0}), host_id="h")
    switch_nodes = topo.nodes_of(NodeKind.NVSWITCH)
    assert sorted(n.busid for n in switch_nodes) == ["0000:c1:00.0", "0000:c2:00.0"]
    for g in range(2):
        out = [l for l in topo.links if l.src == f"gpu{g}" and l.kind is LinkKind.NVLINK]
        assert sorted(l.count for l in out) == [2, 2]
        assert sum(l.bw_bytes_per_s for l in out) == pytest.approx(4 * 25 * GB)
    assert topo.link("gpu0", "cpu0").bw_bytes_per_s == pytest.approx(32e9 * 128 / 130 * 16 / 8)


def test_discover_notes_what_it_could_not_read(monkeypatch, tmp_path):
    gpus = [{"busid": BUS[g], "links": [], "cc": None} for g in range(2)]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(gpus))
    topo = discover_host(sysfs_root=tmp_path, host_id="h")  # empty sysfs: no NUMA
    assert topo.node("gpu0").numa is None
    notes = " ".join(topo.notes)
    assert "NUMA" in notes and "PCIe generation/width not reported" in notes and "no active NVLink" in notes


def test_discover_infiniband_adapters(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(_four_v100()))
    sysfs = _sysfs(tmp_path, dict(zip(SYSFS_BUS, [0, 0, 1, 1])))
    device = sysfs / "bus" / "pci" / "devices" / "0000:86:00.0"
    device.mkdir()
    (device / "numa_node").write_text("1\n")
    (device / "max_link_speed").write_text("16.0 GT/s PCIe\n")
    (device / "max_link_width").write_text("16\n")
    ib = sysfs / "class" / "infiniband" / "mlx5_0"
    (ib / "ports" / "1").mkdir(parents=True)
    (ib / "ports" / "1" / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (ib / "device").symlink_to(device)
    topo = discover_host(sysfs_root=sysfs, host_id="h")
    nic = topo.node("nic0")
    assert (nic.busid, nic.numa) == ("0000:86:00.0", 1)
    assert "200 Gb/s" in nic.name
    assert topo.link("nic0", "cpu1").bw_bytes_per_s == pytest.approx(16e9 * 128 / 130 * 16 / 8)


def test_no_pynvml_means_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    assert discover_host() is None


def test_nvml_init_failure_means_none(monkeypatch):
    fake = _fake_nvml([], init_error=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert discover_host() is None


def test_no_gpu_means_none(monkeypatch):
    fake = _fake_nvml([])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert discover_host() is None
    assert fake.calls == ["init", "shutdown"]


def test_normalize_busid():
    assert normalize_busid(b"00000000:07:00.0") == "0000:07:00.0"
    assert normalize_busid("0000:8A:00.1") == "0000:8a:00.1"
    assert normalize_busid("07:00.0") == "0000:07:00.0"
    assert discover.FLAT_HUB_ID == "hub"
