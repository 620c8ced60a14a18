"""Host discovery against fake machines built from real NCCL topology files, and the flat fallback.

The fake machines (:mod:`tests.topo.fake_host`) are a sysfs tree, a ``cpuinfo`` and the real
``pynvml`` module over a fake C library; discovering one must give what importing the file
gives (:func:`comparable`), which is what NCCL itself made of that machine.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from pathlib import Path

import pytest

from tests.topo.fake_host import (
    DEVICE_TYPE_GPU,
    DEVICE_TYPE_SWITCH,
    FakeGpu,
    FakeHost,
    FakeLink,
    FakeNvmlLibrary,
    fake_pynvml,
    gpus_from_nvml_record,
    host_from_nccl_xml,
    nvml_busid,
)
from tests.topo.fixtures import TOPOLOGY_DIR
from topocoll.errors import TopologyError
from topocoll.topo import bandwidth as bw
from topocoll.topo import discover
from topocoll.topo.discover import discover_host, flat_topology, normalize_busid
from topocoll.topo.model import LinkKind, NodeKind, Topology
from topocoll.topo.nccl_xml import parse_nccl_xml

GB = 1e9
NVML_ERROR_LIBRARY_NOT_FOUND = 12  # nvml.h


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



def test_normalize_busid():
    assert normalize_busid(b"00000000:07:00.0") == "0000:07:00.0"
    assert normalize_busid("0000:8A:00.1") == "0000:8a:00.1"
    assert normalize_busid("07:00.0") == "0000:07:00.0"
    assert discover.FLAT_HUB_ID == "hub"


# ------------------------------------------------------------- discovery == import
def comparable(topology: Topology):
    """Nodes and links of ``topology`` as far as a machine can tell them.

    Left out: notes and names of topologies; the GPU's rank (a property of the run that wrote
    the file, not of the machine: GPUs are named by bus id here) and name (NVML's, absent from
    NCCL files); ``host_id``; and NICs outside any PCI device, which NCCL's socket transport
    lists for virtual interfaces (bridges, veths) and discovery leaves out.
    """
    socket_nics = {n.id for n in topology.nodes if n.kind is NodeKind.NIC and n.busid is None}
    gone = socket_nics | {link.dst for link in topology.links if link.src in socket_nics and link.kind is LinkKind.NET}
    name = {n.id: f"gpu@{n.busid}" if n.kind is NodeKind.GPU else n.id for n in topology.nodes}
    nodes = sorted(
        (name[n.id], n.kind.value, n.numa, n.busid or "", "" if n.kind is NodeKind.GPU else n.name or "")
        for n in topology.nodes
        if n.id not in gone
    )
    links = sorted(
        (name[l.src], name[l.dst], l.kind.value, round(l.bw_bytes_per_s), l.count, l.latency_s)
        for l in topology.links
        if l.src not in gone and l.dst not in gone
    )
    return nodes, links


def gpu_xml_fixtures() -> list[str]:
    """NCCL topology files in the fixtures that describe GPUs (not the skeletons clouds ship)."""
    names = []
    for path in sorted(TOPOLOGY_DIR.glob("*.nccl-topo.xml")):
        if any(n.kind is NodeKind.GPU for n in parse_nccl_xml(path.read_text(), path.name).nodes):
            names.append(path.name)
    return names


def discover_fake(host: FakeHost, **options) -> Topology:
    return discover_host(host.sysfs, host.proc, host_id="fake", nvml=host.nvml, arch=host.arch, **options)


def test_every_gpu_fixture_is_covered():
    names = gpu_xml_fixtures()
    assert len(names) >= 12
    assert {"hgx-h800-8gpu-8nic.nccl-topo.xml", "modal-b200-vm-gvisor.nccl-topo.xml"} <= set(names)
    assert "aws-p5.48xlarge-h100.nccl-topo.xml" not in names  # a skeleton: PCI switches only


@pytest.mark.parametrize("name", gpu_xml_fixtures())
def test_discovery_equals_import(name, tmp_path):
    text = (TOPOLOGY_DIR / name).read_text()
    host = host_from_nccl_xml(text, tmp_path)
    found = discover_fake(host)
    expected = parse_nccl_xml(text, name)
    got_nodes, got_links = comparable(found)
    want_nodes, want_links = comparable(expected)
    assert got_nodes == want_nodes
    assert got_links == want_links
    assert found.name == "discovered:fake"
    assert all(n.host_id == "fake" for n in found.nodes if n.kind is not NodeKind.NET_SWITCH)
    gpus = sorted((n for n in found.nodes if n.kind is NodeKind.GPU), key=lambda n: n.busid)
    assert [n.rank for n in gpus] == list(range(len(gpus)))  # NVML's bus-id order
    assert [n.index for n in gpus] == list(range(len(gpus)))  # NVML's own index
    given_sm = dict(re.findall(r'<pci busid="([^"]+)"[^>]*>\s*<gpu [^>]*sm="(\d+)"', text))
    assert {n.busid: str(n.sm) for n in gpus if n.busid in given_sm} == {k.lower(): v for k, v in given_sm.items()}
    sms = {int(s) for s in re.findall(r'sm="(\d+)"', text)}
    if any(sm >= 90 for sm in sms) and "<nvlink" in text:
        # sm >= 90 GPUs answer the link state only through field values
        assert "nvmlDeviceGetFieldValues" in host.library.calls
        assert "nvmlDeviceGetNvLinkState" not in host.library.calls  # it answers NOT_SUPPORTED there


def test_h800_nvswitches_and_nics(tmp_path):
    """Read off the file: 8 H800 (sm 90), each with 4 NVLinks to each of 4 NVSwitches (18 GB/s
    x 4 = ... per link figure of NVLink 4), 8 NICs of 400 Gb/s."""
    text = (TOPOLOGY_DIR / "hgx-h800-8gpu-8nic.nccl-topo.xml").read_text()
    topo = discover_fake(host_from_nccl_xml(text, tmp_path))
    counts = topo.summary_counts()
    assert counts["gpu"] == 8 and counts["nvswitch"] == 4 and counts["nic"] == 8
    per_link = bw.nvlink_bw_bytes_per_s(bw.nvlink_generation_for_sm(90))
    for gpu in ("gpu0", "gpu7"):
        to_switches = [l for l in topo.links if l.src == gpu and l.kind is LinkKind.NVLINK]
        assert sorted(l.count for l in to_switches) == [2, 2, 2, 2]
        assert all(l.bw_bytes_per_s == pytest.approx(2 * per_link) for l in to_switches)
    nets = [l for l in topo.links if l.kind is LinkKind.NET and l.src.startswith("nic")]
    assert len(nets) == 8 and all(l.bw_bytes_per_s == bw.net_bw_bytes_per_s(400e9) for l in nets)


MACHINES = Path(__file__).parents[1] / "data" / "machines"


def test_a_real_h200_vm_replayed_from_its_snapshot(tmp_path):
    """tests/data/machines/h200-vm (README there): expected values read off its sysfs files."""
    machine = MACHINES / "h200-vm"
    with tarfile.open(machine / "sysfs.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    record = json.loads((machine / "nvml.json").read_text())
    library = FakeNvmlLibrary(gpus_from_nvml_record(record))
    topo = discover_host(tmp_path / "sys", tmp_path / "proc", host_id="h200", nvml=fake_pynvml(library), arch="x86_64")
    assert topo.summary_counts() == {"cpu": 1, "gpu": 1, "nic": 1, "net_switch": 1}
    gpu, nic, cpu = topo.node("gpu0"), topo.node("nic0"), topo.node("cpu0")
    assert (gpu.busid, gpu.name, gpu.rank, gpu.numa) == ("0000:00:06.0", "NVIDIA H200", 0, 0)
    assert (nic.busid, nic.name) == ("0000:00:03.0", "eth0")
    assert cpu.name == "GenuineIntel x86_64 family 6 model 207"
    links = {(l.src, l.dst): l for l in topo.links}
    # max_link_speed 32.0 GT/s, max_link_width 16 on the GPU
    assert links["gpu0", "cpu0"].bw_bytes_per_s == bw.pcie_bw_bytes_per_s(5, 16)
    # the virtio NIC has no link attributes (NCCL's Gen3 x16 fallback) and speed -1 while up
    assert links["nic0", "cpu0"].bw_bytes_per_s == bw.pcie_bw_bytes_per_s(3, 16)
    assert links["nic0", "net0"].bw_bytes_per_s == bw.net_bw_bytes_per_s(10e9)
    assert not any(l.kind is LinkKind.NVLINK for l in topo.links)
    assert any("eth0: network speed not readable: assumed 10 Gb/s" in n for n in topo.notes)
    assert any("no active NVLink" in n for n in topo.notes)
    # NCCL's own dump of the machine agrees on every bandwidth
    nccl = parse_nccl_xml((machine / "nccl-topo.xml").read_text(), "nccl-topo.xml")
    nccl_bw = sorted((l.kind.value, l.bw_bytes_per_s) for l in nccl.links)
    assert sorted((l.kind.value, l.bw_bytes_per_s) for l in topo.links) == nccl_bw


# ---------------------------------------------------------------- NVML, NCCL's rules
def one_gpu_machine(tmp_path: Path, gpus: list[FakeGpu], **options) -> FakeHost:
    """A one-socket machine with ``gpus`` directly on root ports (Gen5 x16)."""
    pci = "".join(
        f'<pci busid="{g.busid}" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"/>' for g in gpus
    )
    xml = f'<system version="1"><cpu numaid="0" vendor="GenuineIntel" familyid="6" modelid="143" arch="x86_64">{pci}</cpu></system>'
    host = host_from_nccl_xml(xml, tmp_path)
    host.library = FakeNvmlLibrary(gpus, **options)
    return host


def test_all_36_link_indices_are_asked(tmp_path):
    # a GPU whose NVLinks use indices up to 35 (nvidia-ml-py's NVML_NVLINK_MAX_LINKS)
    switch = "0000:c0:00.0"
    links = [FakeLink(nvml_busid(switch), DEVICE_TYPE_SWITCH) for _ in range(36)]
    topo = discover_fake(one_gpu_machine(tmp_path, [FakeGpu("0000:07:00.0", 100, links=links)]))
    (link,) = [l for l in topo.links if l.src == "gpu0" and l.kind is LinkKind.NVLINK]
    assert link.count == 36 and topo.node(link.dst).busid == switch


def test_links_without_p2p_or_down_are_left_out(tmp_path):
    a, b = "0000:07:00.0", "0000:08:00.0"
    links_a = [
        FakeLink(nvml_busid(b), DEVICE_TYPE_GPU),
        FakeLink(nvml_busid(b), DEVICE_TYPE_GPU, p2p=False),
        FakeLink(nvml_busid(b), DEVICE_TYPE_GPU, active=False),
    ]
    for sm in (80, 90):  # the link state through nvmlDeviceGetNvLinkState, then field values
        root = tmp_path / str(sm)
        gpus = [FakeGpu(a, sm, links=links_a), FakeGpu(b, sm, links=[FakeLink(nvml_busid(a), DEVICE_TYPE_GPU)])]
        topo = discover_fake(one_gpu_machine(root, gpus))
        assert topo.link("gpu0", "gpu1").count == 1
        assert topo.link("gpu1", "gpu0").count == 1


def test_remote_type_asked_and_inferred_on_old_drivers(tmp_path):
    a, b, switch = "0000:07:00.0", "0000:08:00.0", "0000:c0:00.0"
    gpus = [
        FakeGpu(a, 80, links=[FakeLink(nvml_busid(b), DEVICE_TYPE_GPU), FakeLink(nvml_busid(switch), DEVICE_TYPE_SWITCH)]),
        FakeGpu(b, 80, links=[FakeLink(nvml_busid(a), DEVICE_TYPE_GPU), FakeLink(nvml_busid(switch), DEVICE_TYPE_SWITCH)]),
    ]
    asked = discover_fake(one_gpu_machine(tmp_path / "new", gpus))
    old = discover_fake(one_gpu_machine(tmp_path / "old", gpus, missing={"nvmlDeviceGetNvLinkRemoteDeviceType"}))
    assert comparable(asked) == comparable(old)
    assert asked.node("nvswitch0").busid == switch
    assert asked.link("gpu0", "gpu1").kind is LinkKind.NVLINK


def test_lost_gpu_is_left_out_with_a_note(tmp_path):
    gpus = [FakeGpu("0000:07:00.0", 80), FakeGpu("0000:08:00.0", 80, lost=True)]
    topo = discover_fake(one_gpu_machine(tmp_path, gpus))
    assert [n.busid for n in topo.nodes if n.kind is NodeKind.GPU] == ["0000:07:00.0"]
    assert any("GPU 1 (NVML index)" in note and "left out" in note for note in topo.notes)


def test_nvml_missing_gives_the_cpu_layout(tmp_path):
    text = (TOPOLOGY_DIR / "rtx4090-2gpu-2numa.nccl-topo.xml").read_text()
    host = host_from_nccl_xml(text, tmp_path)
    host.library.init_error = NVML_ERROR_LIBRARY_NOT_FOUND
    topo = discover_fake(host)
    assert not [n for n in topo.nodes if n.kind is NodeKind.GPU]
    assert [n.id for n in topo.nodes if n.kind is NodeKind.CPU] == ["cpu2", "cpu3"]  # the file's numaids
    assert topo.link("cpu2", "cpu3").kind is LinkKind.SMP
    assert any(note.startswith("NVML did not start") for note in topo.notes)
    assert any("NVIDIA GPU(s) in sysfs" in note for note in topo.notes)  # the file's GPUs have vendor 0x10de
    assert topo.summary_counts()["nic"] == 2  # the NICs are still there


def test_programming_errors_are_not_swallowed(tmp_path):
    host = one_gpu_machine(tmp_path, [FakeGpu("0000:07:00.0", 80)])
    module = host.nvml
    del module.nvmlDeviceGetNvLinkCapability  # as a misspelt call would be
    with pytest.raises(AttributeError):
        discover_host(host.sysfs, host.proc, host_id="h", nvml=module)


def test_sm90_gpu_never_reports_state_but_through_fields(tmp_path):
    a, b = "0000:07:00.0", "0000:08:00.0"
    gpus = [FakeGpu(a, 90, links=[FakeLink(nvml_busid(b), DEVICE_TYPE_GPU)]), FakeGpu(b, 90, links=[FakeLink(nvml_busid(a), DEVICE_TYPE_GPU)])]
    host = one_gpu_machine(tmp_path, gpus, missing={"nvmlDeviceGetNvLinkState"})
    topo = discover_fake(host)
    assert topo.link("gpu0", "gpu1").bw_bytes_per_s == bw.nvlink_bw_bytes_per_s(bw.nvlink_generation_for_sm(90))


# ------------------------------------------------------------------------- sysfs
def test_cpu_only_machine_is_its_numa_layout(tmp_path):
    xml = (
        '<system version="1">'
        '<cpu numaid="0" vendor="GenuineIntel" familyid="6" modelid="143" arch="x86_64"/>'
        '<cpu numaid="1" vendor="GenuineIntel" familyid="6" modelid="143" arch="x86_64"/>'
        "</system>"
    )
    host = host_from_nccl_xml(xml, tmp_path)
    host.library.init_error = NVML_ERROR_LIBRARY_NOT_FOUND
    topo = discover_fake(host)
    assert [n.id for n in topo.nodes] == ["cpu0", "cpu1"]
    assert topo.node("cpu0").name == "GenuineIntel x86_64 family 6 model 143"
    assert topo.link("cpu0", "cpu1").bw_bytes_per_s == bw.smp_bw_for_cpu("GenuineIntel", 6, 143)
    assert topo.compute_nodes() == ()


def test_unreadable_entries_degrade_with_notes(tmp_path):
    text = (TOPOLOGY_DIR / "rtx4090-2gpu-2numa.nccl-topo.xml").read_text()
    host = host_from_nccl_xml(text, tmp_path)
    gpu = host.sysfs / "bus" / "pci" / "devices" / "0000:01:00.0"
    for name in ("max_link_speed", "max_link_width"):
        os.remove(gpu / name)
        os.remove(Path(os.path.realpath(gpu)).parent / name)
    (gpu / "numa_node").write_text("-1\n")  # the top device of its chain
    ib = next((host.sysfs / "class" / "infiniband").iterdir())
    (ib / "ports" / "1" / "state").write_text("1: DOWN\n")
    os.remove(host.proc / "cpuinfo")
    topo = discover_fake(host)
    gpu0 = next(n for n in topo.nodes if n.busid == "0000:01:00.0")
    (up,) = [l for l in topo.links if l.src == gpu0.id and l.kind is LinkKind.PCIE]
    assert up.bw_bytes_per_s == bw.pcie_bw_bytes_per_s(3, 16)
    notes = " | ".join(topo.notes)
    assert "0000:01:00.0: PCIe max_link_speed/max_link_width not readable" in notes
    assert "0000:01:00.0: NUMA node unknown" in notes
    assert f"{ib.name} port 1 is DOWN: left out" in notes
    assert "CPU vendor unknown" in notes


def test_plain_ethernet_nic_and_virtual_interfaces(tmp_path):
    xml = (
        '<system version="1"><cpu numaid="0" vendor="AuthenticAMD" familyid="25" modelid="1" arch="x86_64">'
        '<pci busid="0000:41:00.0" class="0x020000" link_speed="16.0 GT/s PCIe" link_width="8">'
        '<nic><net name="eth0" speed="25000"/></nic></pci>'
        '<nic><net name="docker0" speed="10000"/></nic>'
        "</cpu></system>"
    )
    host = host_from_nccl_xml(xml, tmp_path)
    assert (host.sysfs / "class" / "net" / "docker0").is_dir()
    topo = discover_fake(host)
    assert [n.name for n in topo.nodes if n.kind is NodeKind.NIC] == ["eth0"]
    assert topo.link("nic0", "net0").bw_bytes_per_s == bw.net_bw_bytes_per_s(25e9)
    assert topo.link("nic0", "cpu0").bw_bytes_per_s == bw.pcie_bw_bytes_per_s(4, 8)


def test_this_machine_discovers_without_error():
    topo = discover_host()  # whatever this machine is: never None, never an exception
    assert topo.summary_counts()["cpu"] >= 1
