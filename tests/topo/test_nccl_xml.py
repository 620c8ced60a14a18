"""NCCL topology XML import/export, on every real NCCL XML file of the shared fixtures.

Expected values come from reading each file; the comment next to each number says where.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tests.topo.fixtures import (
    GB,
    all_fixture_names,
    by_busid,
    fixture_text,
    gpus_under,
    ids_of,
    net_speeds,
    nvlink_bw,
    nvlink_count,
    pcie_parent,
)
from topocoll.errors import FormatError, TopologyError
from topocoll.topo.model import LinkKind, Node, NodeKind, Topology, TopologyBuilder
from topocoll.topo.nccl_xml import parse_link_speed, parse_nccl_xml
from topocoll.topo.nccl_xml_export import to_nccl_xml
from topocoll.topo.presets import build_preset
from topocoll.topo.safe_xml import MAX_XML_ATTRIBUTE_CHARS, MAX_XML_DEPTH, read_xml

PCIE_GEN3_X16 = 8e9 * 128 / 130 / 8 * 16  # PCI-SIG: 8 GT/s, 128b/130b, 16 lanes
PCIE_GEN4_X16 = 2 * PCIE_GEN3_X16
PCIE_GEN5_X16 = 4 * PCIE_GEN3_X16
XML_FIXTURES = [n for n in all_fixture_names() if n.endswith(".nccl-topo.xml")]


def load(name: str) -> Topology:
    return parse_nccl_xml(fixture_text(name), name)


def numa_of_gpus(topo: Topology) -> dict[int, int]:
    return {n.rank if n.rank is not None else int(n.id[3:]): n.numa for n in topo.nodes_of(NodeKind.GPU)}


# ------------------------------------------------------------------------- one test per file


def test_alibaba_hgx_a100_8gpu():
    topo = load("alibaba-hgx-a100-8gpu-5bond.nccl-topo.xml")
    gpus = topo.nodes_of(NodeKind.GPU)
    assert [g.rank for g in gpus] == list(range(8))  # <gpu rank="0".."7">
    # every <gpu sm="80"> has 6 <nvlink count="2" tclass="0x068000"> to c0..c5:00.0
    assert len(topo.nodes_of(NodeKind.NVSWITCH)) == 6
    assert {n.busid for n in topo.nodes_of(NodeKind.NVSWITCH)} == {f"0000:c{i}:00.0" for i in range(6)}
    for gpu in gpus:
        assert nvlink_count(topo, gpu.id) == 12
        assert nvlink_bw(topo, gpu.id) == pytest.approx(12 * 25 * GB)  # sm 80 = NVLink 3, 25 GB/s
    # five <net name="mlx5_bond_N" speed="200000"> (Mbit/s) = 25 GB/s
    assert net_speeds(topo) == {f"mlx5_bond_{i}": pytest.approx(25 * GB) for i in range(5)}
    # class 0x060400 elements: 0c 0e 11 15 17 41 43 46 49 4b under cpu 0, 82 .. b1 under cpu 1
    assert len(topo.nodes_of(NodeKind.PCIE_SWITCH)) == 20
    # GPU 0 (13:00.0) sits under 11 < 0e < 0c, GPU 1 (19:00.0) under 17 < 15 < 0c
    assert pcie_parent(topo, "gpu0") == by_busid(topo, "0000:11:00.0")
    assert pcie_parent(topo, "gpu1") == by_busid(topo, "0000:17:00.0")
    top = by_busid(topo, "0000:0c:00.0")
    assert pcie_parent(topo, pcie_parent(topo, pcie_parent(topo, "gpu0"))) == top
    assert pcie_parent(topo, pcie_parent(topo, pcie_parent(topo, "gpu1"))) == top
    assert pcie_parent(topo, top) == "cpu0"
    # mlx5_bond_1 (1a:00.0) hangs off 15:00.0 like GPU 1's switch 17:00.0; bond_0 off the CPU
    nic1 = by_busid(topo, "0000:1a:00.0", NodeKind.NIC)
    assert pcie_parent(topo, nic1) == by_busid(topo, "0000:15:00.0")
    assert pcie_parent(topo, by_busid(topo, "0000:06:00.0", NodeKind.NIC)) == "cpu0"
    assert numa_of_gpus(topo) == {r: 0 if r < 4 else 1 for r in range(8)}  # numaid 0 / 1
    # GenuineIntel family 6 model 106 (>= Skylake's 0x55): NCCL's SKL_QPI_BW 10 GB/s
    assert topo.link("cpu0", "cpu1").bw_bytes_per_s == 10 * GB
    assert topo.capacity("gpu0", pcie_parent(topo, "gpu0")) == pytest.approx(PCIE_GEN4_X16)  # 16 GT/s x16
    assert topo.notes == ()  # a complete dump: nothing assumed


def test_alibaba_a100_4gpu_subset():
    topo = load("alibaba-a100-4gpu-2nic.nccl-topo.xml")
    assert len(topo.nodes_of(NodeKind.GPU)) == 4  # ranks 0-3 only
    assert ids_of(topo, NodeKind.CPU) == ["cpu0"]  # one <cpu numaid="0">: no smp link
    assert not [l for l in topo.links if l.kind is LinkKind.SMP]
    assert all(nvlink_count(topo, g) == 12 for g in ids_of(topo, NodeKind.GPU))  # 6 targets x 2
    assert sorted(net_speeds(topo)) == ["mlx5_bond_0", "mlx5_bond_1", "mlx5_bond_2"]
    assert len(topo.nodes_of(NodeKind.PCIE_SWITCH)) == 10  # 0c 0e 11 15 17 41 43 46 49 4b


def test_hgx_h800():
    topo = load("hgx-h800-8gpu-8nic.nccl-topo.xml")
    assert len(topo.nodes_of(NodeKind.GPU)) == 8
    # 4 NVSwitch targets 03..06:00.0, count 2 each, sm 90 (NVLink 4, 25 GB/s per link)
    assert {n.busid for n in topo.nodes_of(NodeKind.NVSWITCH)} == {f"0000:0{i}:00.0" for i in range(3, 7)}
    for gpu in ids_of(topo, NodeKind.GPU):
        assert nvlink_count(topo, gpu) == 8
        assert nvlink_bw(topo, gpu) == pytest.approx(200 * GB)
    # nets mlx5_0, mlx5_3 .. mlx5_9, speed 400000 Mbit/s = 50 GB/s
    assert net_speeds(topo) == {n: pytest.approx(50 * GB) for n in ["mlx5_0"] + [f"mlx5_{i}" for i in range(3, 10)]}
    switches = topo.nodes_of(NodeKind.PCIE_SWITCH)
    assert len(switches) == 8  # 0c 32 45 58 under cpu 0, 84 ac c0 d4 under cpu 1
    # each switch holds one GPU and one NIC: 0c:00.0 holds GPU 0f:00.0 (rank 0) and mlx5_0
    sw = by_busid(topo, "0000:0c:00.0")
    assert gpus_under(topo, sw) == {0}
    assert pcie_parent(topo, by_busid(topo, "0000:0e:00.0", NodeKind.NIC)) == sw
    assert all(len(gpus_under(topo, s.id)) == 1 for s in switches)
    assert topo.capacity("gpu0", sw) == pytest.approx(PCIE_GEN5_X16)  # "32.0 GT/s PCIe" x16
    assert numa_of_gpus(topo) == {r: 0 if r < 4 else 1 for r in range(8)}
    # GenuineIntel family 6 model 143 = 0x8F, Sapphire Rapids: NCCL's SRP_QPI_BW 22 GB/s
    assert topo.link("cpu0", "cpu1").bw_bytes_per_s == 22 * GB


def test_modal_b200_vm():
    topo = load("modal-b200-vm-gvisor.nccl-topo.xml")
    # target fffffff:ff:ff.0 count 18: one hidden NVSwitch; sm 100 = NVLink 5, 50 GB/s
    (switch,) = topo.nodes_of(NodeKind.NVSWITCH)
    assert switch.busid is None
    for gpu in ids_of(topo, NodeKind.GPU):
        assert nvlink_count(topo, gpu) == 18
        assert nvlink_bw(topo, gpu) == pytest.approx(900 * GB)
        assert topo.has_link(gpu, switch.id) and topo.has_link(switch.id, gpu)
    speeds = net_speeds(topo)
    assert len(speeds) == 13  # mlx5_0 .. mlx5_12
    assert [speeds[f"mlx5_{i}"] for i in range(5)] == [12.5 * GB] * 4 + [25 * GB]  # 100000 x4, 200000
    assert all(speeds[f"mlx5_{i}"] == 50 * GB for i in range(5, 13))  # 400000
    # three host bridges (class 0x060000) each carrying a <nic> with several nets
    cards = {s.busid: s.id for s in topo.nodes_of(NodeKind.PCIE_SWITCH)}
    assert set(cards) == {"0000:00:00.0", "0002:00:00.0", "0003:00:00.0"}
    ports = {busid: sum(1 for n in topo.nodes_of(NodeKind.NIC) if pcie_parent(topo, n.id) == sw) for busid, sw in cards.items()}
    assert ports == {"0000:00:00.0": 5, "0002:00:00.0": 4, "0003:00:00.0": 4}
    # link_speed="" link_width="0" on the bridges: NCCL's fallback, and a note says so
    assert topo.capacity(cards["0000:00:00.0"], "cpu0") == pytest.approx(PCIE_GEN3_X16)
    assert any("link_speed" in note for note in topo.notes)
    assert any("NVSwitch not visible" in note for note in topo.notes)
    assert numa_of_gpus(topo) == {r: 0 if r < 4 else 1 for r in range(8)}


def test_azure_ndv4_partial():
    topo = load("azure-ndv4-a100.nccl-topo.xml")
    gpus = topo.nodes_of(NodeKind.GPU)
    assert len(gpus) == 8  # class 0x030200 leaves, no <gpu> element
    assert all(g.rank is None for g in gpus)
    assert not [l for l in topo.links if l.kind is LinkKind.NVLINK]
    assert len(topo.nodes_of(NodeKind.NIC)) == 8  # class 0x020700 leaves, no speed
    assert net_speeds(topo) == {}
    # four virtual switches ffff:ff:01..04.0, each with 2 GPUs and 2 NICs, one per NUMA node
    for index, (gpu_a, gpu_b) in enumerate([("0003", "0004"), ("0001", "0002"), ("000d", "000e"), ("000b", "000c")]):
        switch = by_busid(topo, f"ffff:ff:0{index + 1}.0")
        for busid in (gpu_a, gpu_b):
            assert pcie_parent(topo, by_busid(topo, f"{busid}:00:00.0")) == switch
        assert topo.node(switch).numa == index
    assert ids_of(topo, NodeKind.CPU) == ["cpu0", "cpu1", "cpu2", "cpu3"]
    assert topo.link("cpu0", "cpu3").bw_bytes_per_s == 16 * GB  # AuthenticAMD: NCCL's AMD_BW
    assert any("without a <gpu> element" in n for n in topo.notes)
    assert any("without a network speed" in n for n in topo.notes)


def test_azure_ndv5():
    topo = load("azure-ndv5-h100.nccl-topo.xml")
    switches = topo.nodes_of(NodeKind.PCIE_SWITCH)
    assert len(switches) == 8 and len(topo.nodes_of(NodeKind.GPU)) == 8 and len(topo.nodes_of(NodeKind.NIC)) == 8
    for switch in switches:  # one GPU and one NIC per virtual switch
        kids = [n for n in topo.nodes if n.kind in (NodeKind.GPU, NodeKind.NIC) and pcie_parent(topo, n.id) == switch.id]
        assert sorted(k.kind.value for k in kids) == ["gpu", "nic"]
    assert topo.capacity(by_busid(topo, "0001:00:00.0"), by_busid(topo, "ffff:ff:01.0")) == pytest.approx(PCIE_GEN5_X16)
    assert sum(1 for n in topo.nodes_of(NodeKind.GPU) if n.numa == 0) == 4


def test_azure_ndv2_flat():
    topo = load("azure-ndv2-v100.nccl-topo.xml")
    assert not topo.nodes_of(NodeKind.PCIE_SWITCH)  # GPUs are direct children of <cpu>
    gpus = topo.nodes_of(NodeKind.GPU)
    assert len(gpus) == 8 and {pcie_parent(topo, g.id) for g in gpus} == {"cpu0", "cpu1"}
    assert [n.busid for n in topo.nodes_of(NodeKind.NIC)] == ["0101:00:00.0"]
    assert topo.link("cpu0", "cpu1").bw_bytes_per_s == 10 * GB  # Intel model 85 = 0x55: Skylake
    assert not [l for l in topo.links if l.kind is LinkKind.NVLINK]


def test_azure_ncv4_self_nvlink_and_socket_nic():
    topo = load("azure-ncv4-a100pcie.nccl-topo.xml")
    assert [g.rank for g in topo.nodes_of(NodeKind.GPU)] == [0, 1, 2, 3]
    # <nvlink target=own busid count=12>: ignored, with a note
    assert not [l for l in topo.links if l.kind is LinkKind.NVLINK]
    assert any("target is the GPU itself" in n for n in topo.notes)
    # link_speed="" link_width="0": NCCL's fallback Gen3 x16
    assert topo.capacity("gpu0", "cpu0") == pytest.approx(PCIE_GEN3_X16)
    # eth0, speed 100000, directly under cpu numaid 0
    (nic,) = topo.nodes_of(NodeKind.NIC)
    assert (nic.name, nic.busid, pcie_parent(topo, nic.id)) == ("eth0", None, "cpu0")
    assert net_speeds(topo) == {"eth0": 12.5 * GB}
    assert len(topo.nodes_of(NodeKind.CPU)) == 4


@pytest.mark.parametrize("name", ["aws-p4d.24xlarge-a100.nccl-topo.xml", "aws-p4de.24xlarge-a100.nccl-topo.xml"])
def test_aws_p4d(name):
    topo = load(name)
    assert len(topo.nodes_of(NodeKind.GPU)) == 8 and len(topo.nodes_of(NodeKind.NIC)) == 4
    for index in range(4):  # "Switch N": 2 GPUs (..:1c.0, ..:1d.0) + 1 EFA NIC (..:1b.0)
        switch = by_busid(topo, f"ffff:ff:0{index + 1}.0")
        bus = ["10", "20", "90", "a0"][index]
        assert {pcie_parent(topo, by_busid(topo, f"0000:{bus}:{dev}.0")) for dev in ("1b", "1c", "1d")} == {switch}
        assert topo.capacity(switch, f"cpu{index // 2}") == pytest.approx(PCIE_GEN3_X16)  # "8 GT/s" x16
    assert net_speeds(topo) == {}


def test_aws_p5_bare_busids():
    topo = load("aws-p5.48xlarge-h100.nccl-topo.xml")
    assert not topo.nodes_of(NodeKind.GPU)  # "GPUs are not reported in this file"
    assert len(topo.nodes_of(NodeKind.PCIE_SWITCH)) == 40  # 8 groups + 32 children, no class
    leaf = by_busid(topo, "0000:4f:00.0")
    assert pcie_parent(topo, leaf) == by_busid(topo, "0000:45:00.0")
    assert topo.capacity(leaf, pcie_parent(topo, leaf)) == pytest.approx(PCIE_GEN5_X16)  # "32 GT/s PCIe/s"
    assert any("without a class" in n for n in topo.notes)
    assert "no GPUs in the file" in topo.notes and "no NICs in the file" in topo.notes


def test_aws_g5_bare_busids():
    topo = load("aws-g5.48xlarge-a10g.nccl-topo.xml")
    assert len(topo.nodes_of(NodeKind.PCIE_SWITCH)) == 9  # 4 + 5 <pci busid=...>
    assert any("CPU vendor unknown" in n for n in topo.notes)


def test_rtx3090_two_switches():
    topo = load("rtx3090-8gpu-pcie-1ib.nccl-topo.xml")
    assert not [l for l in topo.links if l.kind is LinkKind.NVLINK]
    sw0, sw1 = by_busid(topo, "0000:0c:00.0"), by_busid(topo, "0000:98:00.0")
    assert gpus_under(topo, sw0) == {0, 1, 2, 3} and gpus_under(topo, sw1) == {4, 5, 6, 7}
    assert any(n.startswith("no NVLinks listed for 8 GPU(s)") for n in topo.notes)  # <gpu .../> only
    (nic,) = topo.nodes_of(NodeKind.NIC)
    assert pcie_parent(topo, nic.id) == sw1
    assert net_speeds(topo) == {"mlx5_0": 7 * GB}  # speed 56000 Mbit/s


def test_rtx4090_dual_port_nic():
    topo = load("rtx4090-2gpu-2numa.nccl-topo.xml")
    assert {g.rank: g.numa for g in topo.nodes_of(NodeKind.GPU)} == {0: 3, 1: 2}  # numaid 3 then 2
    card = by_busid(topo, "0000:02:00.0", NodeKind.PCIE_SWITCH)
    ports = [n for n in topo.nodes_of(NodeKind.NIC) if pcie_parent(topo, n.id) == card]
    assert sorted(p.name for p in ports) == ["mlx5_0", "mlx5_1"]
    assert net_speeds(topo) == {"mlx5_0": 12.5 * GB, "mlx5_1": 12.5 * GB}
    assert topo.capacity(card, "cpu3") == pytest.approx(PCIE_GEN3_X16)  # "8.0 GT/s PCIe" x16


def test_rtx4090_socket_nics_listed_under_every_cpu():
    topo = load("rtx4090-4gpu-nps-socketnics.nccl-topo.xml")
    # ranks 0..3 with dev 0, 1, 3, 4 on NUMA 3, 2, 0, 7
    assert {g.rank: g.numa for g in topo.nodes_of(NodeKind.GPU)} == {0: 3, 1: 2, 2: 0, 3: 7}
    speeds = net_speeds(topo)
    assert len(speeds) == 16  # 15 distinct socket nets (kept once) + enp34s0f0
    assert speeds["enp34s0f0"] == 0.125 * GB and speeds["tunl0"] == 1.25 * GB
    socket = [n for n in topo.nodes_of(NodeKind.NIC) if n.busid is None]
    assert len(socket) == 15 and {pcie_parent(topo, n.id) for n in socket} == {"cpu3"}  # first <cpu>
    enp = next(n for n in topo.nodes_of(NodeKind.NIC) if n.name == "enp34s0f0")
    assert topo.capacity(enp.id, "cpu2") == pytest.approx(PCIE_GEN3_X16 / 4)  # "8.0 GT/s PCIe" x4


def test_l20_rank_order_interleaves_numa():
    topo = load("l20-16gpu-pcie-8nic.nccl-topo.xml")
    assert len(topo.nodes_of(NodeKind.GPU)) == 16 and not [l for l in topo.links if l.kind is LinkKind.NVLINK]
    assert numa_of_gpus(topo) == {r: 0 if r < 8 else 1 for r in range(16)}
    assert topo.node("gpu2").busid == "0000:4e:00.0"  # rank 2 is dev 4
    assert len(topo.nodes_of(NodeKind.PCIE_SWITCH)) == 12  # 6 per CPU
    assert gpus_under(topo, by_busid(topo, "0000:0e:00.0")) == {0, 1}
    assert gpus_under(topo, by_busid(topo, "0000:4b:00.0")) == {2, 3}
    assert len(net_speeds(topo)) == 8 and set(net_speeds(topo).values()) == {50 * GB}
    assert topo.capacity("gpu0", by_busid(topo, "0000:0e:00.0")) == pytest.approx(PCIE_GEN4_X16)


def test_graph_file_is_refused():
    with pytest.raises(FormatError, match=r"azure-ncv4-a100pcie\.nccl-graph\.xml: line 2: .*graph file"):
        parse_nccl_xml(fixture_text("azure-ncv4-a100pcie.nccl-graph.xml"), "azure-ncv4-a100pcie.nccl-graph.xml")


def test_every_xml_fixture_has_a_test_above():
    tested = {
        "alibaba-hgx-a100-8gpu-5bond", "alibaba-a100-4gpu-2nic", "hgx-h800-8gpu-8nic", "modal-b200-vm-gvisor",
        "azure-ndv4-a100", "azure-ndv5-h100", "azure-ndv2-v100", "azure-ncv4-a100pcie", "aws-p4d.24xlarge-a100",
        "aws-p4de.24xlarge-a100", "aws-p5.48xlarge-h100", "aws-g5.48xlarge-a10g", "rtx3090-8gpu-pcie-1ib",
        "rtx4090-2gpu-2numa", "rtx4090-4gpu-nps-socketnics", "l20-16gpu-pcie-8nic",
    }
    assert {n.removesuffix(".nccl-topo.xml") for n in XML_FIXTURES} <= tested


# ---------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", XML_FIXTURES)
def test_round_trip_xml_json_xml_json(name):
    """Identical means: the same canonical JSON text (nodes, links, name and notes)."""
    first = load(name)
    exported = to_nccl_xml(first)
    again = parse_nccl_xml(exported, "exported.xml")
    assert again.to_json() == first.to_json()
    assert to_nccl_xml(again) == exported
    assert Topology.from_json(first.to_json(), "x.json").to_json() == first.to_json()


NCCL_PCI_GEN_KEYS = {"2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe"}


@pytest.mark.parametrize("name", XML_FIXTURES)
def test_export_has_the_structure_nccl_reads(name):
    root = ET.fromstring(to_nccl_xml(load(name)))
    assert root.tag == "system" and root.get("version") == "1"
    for pci in root.iter("pci"):
        assert pci.get("busid") and pci.get("class", "").startswith("0x")
        assert pci.get("link_speed") in NCCL_PCI_GEN_KEYS  # keys of NCCL's kvDictPciGen
        assert int(pci.get("link_width")) in (1, 2, 4, 8, 16, 32)
    for link in root.iter("nvlink"):
        assert link.get("target") and int(link.get("count")) >= 1 and link.get("tclass")
    for net in root.iter("net"):
        assert net.get("name") and net.get("dev", "").isdigit()
    for element in root.iter():
        assert len(element.attrib) <= 16  # NCCL's MAX_ATTR_COUNT


def _gpu_and_net_attributes(root: ET.Element) -> tuple[dict, dict]:
    """``{busid: <gpu> attributes}`` and ``{port name: <net> attributes}`` of an NCCL XML tree."""
    gpus = {pci.get("busid").lower(): dict(gpu.attrib) for pci in root.iter("pci") for gpu in pci.findall("gpu")}
    nets = {net.get("name"): dict(net.attrib) for net in root.iter("net")}
    return gpus, nets


@pytest.mark.parametrize("name", XML_FIXTURES)
def test_export_writes_back_what_nccl_needs_of_gpus_and_ports(name):
    """``dev``, ``sm``, ``rank``, ``gdr`` of every GPU and ``speed``, ``gdr`` of every port, as the file had them."""
    original, exported = (ET.fromstring(text) for text in (fixture_text(name), to_nccl_xml(load(name))))
    given_gpus, given_nets = _gpu_and_net_attributes(original)
    out_gpus, out_nets = _gpu_and_net_attributes(exported)
    for busid, attrs in given_gpus.items():
        for key in ("dev", "sm", "rank", "gdr"):
            if key in attrs:
                assert out_gpus[busid].get(key) == attrs[key], (busid, key)
    for port, attrs in given_nets.items():
        if port not in out_nets:
            continue  # a port the import left out, as noted in the topology
        for key in ("gdr",):
            if key in attrs:
                assert out_nets[port].get(key) == attrs[key], (port, key)
        if float(attrs.get("speed", "0")) > 0:
            assert float(out_nets[port]["speed"]) == float(attrs["speed"]), port


@pytest.mark.parametrize(("preset", "sm", "speed_mbps"), [("dgx1-v100", "70", 100000), ("dgx-h100", "90", 400000), ("pcie-8gpu", None, 100000)])
def test_export_of_a_preset_names_devices_models_and_port_speeds(preset, sm, speed_mbps):
    """NVML indices 0..7, the GPU model's compute capability, and the adapters' line rate."""
    root = ET.fromstring(to_nccl_xml(build_preset(preset)))
    gpus = [gpu.attrib for gpu in root.iter("gpu")]
    assert sorted(int(g["dev"]) for g in gpus) == list(range(8))
    assert all(g.get("sm") == sm for g in gpus)
    nets = list(root.iter("net"))
    assert nets and all(float(net.get("speed")) == speed_mbps for net in nets)


def test_export_of_a_built_topology_keeps_links():
    """A topology made in code (no bus ids, CPUs without a vendor, two anonymous NVSwitches)."""
    b = TopologyBuilder("hand")
    for c in range(2):
        b.add_node(Node(f"cpu{c}", NodeKind.CPU, numa=c, name="some CPU"))
        b.add_node(Node(f"nvswitch{c}", NodeKind.NVSWITCH))
    b.add_link("cpu0", "cpu1", LinkKind.SMP, 7e9)
    for i in range(2):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU, rank=i, numa=i))
        b.add_link(f"gpu{i}", f"cpu{i}", LinkKind.PCIE, 20e9)  # no (gen, width) gives this exactly
        for c in range(2):
            b.add_link(f"gpu{i}", f"nvswitch{c}", LinkKind.NVLINK, 75e9, count=3)
    b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 100e9, count=4)
    topo = b.build()
    back = parse_nccl_xml(to_nccl_xml(topo), "back.xml")
    def shape(t):  # latencies are checked by the next test
        return [(l.src, l.dst, l.kind, l.bw_bytes_per_s, l.count) for l in t.links]

    assert shape(back) == shape(topo)
    assert [n.id for n in back.nodes] == [n.id for n in topo.nodes]
    assert [n.rank for n in back.nodes_of(NodeKind.GPU)] == [0, 1]


def test_export_refuses_what_xml_cannot_say():
    b = TopologyBuilder()
    for i in range(2):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU))
    b.add_link("gpu0", "gpu1", LinkKind.XGMI, 64e9)
    with pytest.raises(FormatError, match="gpu0->gpu1 is xgmi"):
        to_nccl_xml(b.build())


# --------------------------------------------------------------------------------- link speeds


@pytest.mark.parametrize(
    "text, rate",
    [("16 GT/s", 16.0), ("16.0 GT/s PCIe", 16.0), ("8.0 GT/s", 8.0), ("2.5 GT/s", 2.5), ("32 GT/s PCIe/s", 32.0),
     ("Unknown", None), ("", None), (None, None)],
)
def test_link_speed_spellings(text, rate):
    assert parse_link_speed(text) == rate


@pytest.mark.parametrize("attrs", ['link_speed="Unknown" link_width="16"', 'link_speed="" link_width=""', ""])
def test_unknown_speed_or_width_uses_default_and_notes(attrs):
    text = f'<system version="1"><cpu numaid="0"><pci busid="0000:01:00.0" class="0x030200" {attrs}/></cpu></system>'
    topo = parse_nccl_xml(text, "s.xml")
    assert topo.capacity("gpu0", "cpu0") == pytest.approx(PCIE_GEN3_X16)
    assert any("assumed" in n for n in topo.notes)


def test_gpu_to_gpu_nvlinks_and_ranks():
    text = """<system version="1"><cpu numaid="0">
      <pci busid="0000:01:00.0" class="0x030200" link_speed="16 GT/s" link_width="16">
        <gpu dev="0" sm="70" rank="1"><nvlink target="0000:02:00.0" count="2" tclass="0x030200"/></gpu></pci>
      <pci busid="0000:02:00.0" class="0x030200" link_speed="16 GT/s" link_width="16">
        <gpu dev="1" sm="70" rank="0"><nvlink target="0000:01:00.0" count="2" tclass="0x030200"/></gpu></pci>
    </cpu></system>"""
    topo = parse_nccl_xml(text, "p.xml")
    assert topo.node("gpu0").busid == "0000:02:00.0"  # ids follow ranks, not document order
    link = topo.link("gpu0", "gpu1")
    assert (link.kind, link.count, link.bw_bytes_per_s) == (LinkKind.NVLINK, 2, 50 * GB)  # sm 70: 25 GB/s
    assert topo.compute_nodes() == ("gpu0", "gpu1")


# -------------------------------------------------------------------------------- bad input

GOOD_GPU = '<pci busid="0000:0{i}:00.0" class="0x030200" link_speed="16 GT/s" link_width="16"><gpu dev="{i}" sm="80" rank="{r}"/></pci>'


def test_malformed_xml_names_file_and_line():
    with pytest.raises(FormatError, match=r"^bad\.xml: line 3: malformed XML: mismatched tag$"):
        parse_nccl_xml('<system version="1">\n<cpu numaid="0">\n</system>', "bad.xml")


def test_entity_bomb_is_refused_before_parsing():
    bomb = '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n <!ENTITY lol2 "&lol;&lol;&lol;&lol;">\n]>\n<system>&lol2;</system>'
    with pytest.raises(FormatError, match=r"^bomb\.xml: line 2: <!DOCTYPE"):
        parse_nccl_xml(bomb, "bomb.xml")


def test_external_entity_is_refused():
    xxe = '<!DOCTYPE system [<!ENTITY x SYSTEM "file:///etc/hostname">]><system version="1">&x;</system>'
    with pytest.raises(FormatError, match=r"^xxe\.xml: line 1: .*refused"):
        parse_nccl_xml(xxe, "xxe.xml")


def _bridges(levels: int) -> str:
    """A ``<system>`` whose PCIe bridges nest so that the document is ``levels`` elements deep."""
    pci = '<pci class="0x060400" link_speed="16 GT/s" link_width="16">'
    bridges = levels - 2  # <system> and <cpu> are the first two levels
    return f'<system version="1"><cpu numaid="0">{pci * bridges}{"</pci>" * bridges}</cpu></system>'


def test_nesting_up_to_the_limit_is_read_and_one_more_level_refused():
    topo = parse_nccl_xml(_bridges(MAX_XML_DEPTH), "deep.xml")
    assert len(ids_of(topo, NodeKind.PCIE_SWITCH)) == MAX_XML_DEPTH - 2
    with pytest.raises(FormatError, match=rf"^deep\.xml: line 1: <pci> is nested deeper than {MAX_XML_DEPTH} levels$"):
        parse_nccl_xml(_bridges(MAX_XML_DEPTH + 1), "deep.xml")


def test_every_real_file_is_far_inside_the_limits():
    deepest = longest = 0
    for name in all_fixture_names():
        if not name.endswith(".xml"):
            continue
        stack = [(read_xml(fixture_text(name), name).root, 1)]
        while stack:
            element, depth = stack.pop()
            deepest = max(deepest, depth)
            longest = max([longest, *(len(v) for v in element.attrs.values())])
            stack += [(child, depth + 1) for child in element.children]
    assert 8 * deepest <= MAX_XML_DEPTH
    assert 16 * max(longest, 255) <= MAX_XML_ATTRIBUTE_CHARS  # 255: NCCL's own longest value


@pytest.mark.parametrize("where", ["value", "name", "tag"])
def test_attribute_up_to_the_limit_is_read_and_a_longer_one_refused(where):
    def document(length: int) -> str:
        text = "x" * length
        if where == "value":
            return f'<system version="1"><cpu numaid="0" vendor="{text}"/></system>'
        if where == "name":
            return f'<system version="1"><cpu numaid="0" {text}="1"/></system>'
        return f'<system version="1"><cpu numaid="0"><{text}/></cpu></system>'

    parse_nccl_xml(document(MAX_XML_ATTRIBUTE_CHARS), "long.xml")
    with pytest.raises(FormatError, match=rf"^long\.xml: line 1: .* of {MAX_XML_ATTRIBUTE_CHARS + 1:,} characters") as info:
        parse_nccl_xml(document(MAX_XML_ATTRIBUTE_CHARS + 1), "long.xml")
    assert len(str(info.value)) < 200  # the value itself is not copied into the message


def test_doctype_in_a_comment_is_not_a_declaration():
    topo = parse_nccl_xml('<!-- <!DOCTYPE x> -->\n<system version="1"><cpu numaid="0"/></system>', "c.xml")
    assert ids_of(topo, NodeKind.CPU) == ["cpu0"]


def test_wrong_attribute_type_names_line():
    text = '<system version="1">\n<cpu numaid="0">\n' + GOOD_GPU.format(i=1, r="zero") + "\n</cpu></system>"
    with pytest.raises(FormatError, match=r"^t\.xml: line 3: <gpu> rank='zero' is not an integer$"):
        parse_nccl_xml(text, "t.xml")


def test_bad_nvlink_count_names_line():
    text = '<system version="1"><cpu numaid="0">\n<pci busid="0000:01:00.0" class="0x030200"><gpu sm="80">\n<nvlink target="0000:c0:00.0" count="-2" tclass="0x068000"/></gpu></pci></cpu></system>'
    with pytest.raises(FormatError, match=r"^n\.xml: line 3: <nvlink> count='-2' must be >= 1$"):
        parse_nccl_xml(text, "n.xml")


def test_duplicate_ranks_name_both_lines():
    text = '<system version="1"><cpu numaid="0">\n' + GOOD_GPU.format(i=1, r=0) + "\n" + GOOD_GPU.format(i=2, r=0) + "\n</cpu></system>"
    with pytest.raises(FormatError, match=r"^d\.xml: line 3: <gpu rank=\"0\">: rank 0 already used by the GPU on line 2$"):
        parse_nccl_xml(text, "d.xml")


def test_unknown_nvlink_target_is_noted_not_invented():
    text = '<system version="1"><cpu numaid="0">' + GOOD_GPU.format(i=1, r=0).replace(
        "/></pci>", '><nvlink target="0000:99:00.0" count="2" tclass="0x030200"/></gpu></pci>'
    ) + "</cpu></system>"
    topo = parse_nccl_xml(text, "u.xml")
    assert not [l for l in topo.links if l.kind is LinkKind.NVLINK]
    assert any("0000:99:00.0" in n for n in topo.notes)


def test_other_root_element_is_refused():
    with pytest.raises(FormatError, match=r"^r\.xml: line 1: root element is <topology>"):
        parse_nccl_xml("<topology/>", "r.xml")


def test_partial_file_without_gpus_says_so():
    topo = parse_nccl_xml('<system version="1"><cpu numaid="0"><pci busid="0000:00:01.0"/></cpu></system>', "e.xml")
    assert topo.nodes_of(NodeKind.GPU) == ()
    assert any("without a class" in n for n in topo.notes)


def test_model_errors_name_the_file():
    # a GPU whose only link is an NVLink to a GPU of another, unconnected system is impossible in
    # XML (everything hangs off a CPU), so check the wrapper with a two-CPU file whose GPUs are
    # still connected, then a JSON-level error from the model itself.
    text = '<system version="1"><cpu numaid="0">' + GOOD_GPU.format(i=1, r=0) + "</cpu>" + '<cpu numaid="1">' + GOOD_GPU.format(i=2, r=1) + "</cpu></system>"
    topo = parse_nccl_xml(text, "two.xml")
    assert topo.has_link("cpu0", "cpu1")  # CPUs always joined, so GPUs stay connected
    with pytest.raises(TopologyError, match=r"^j\.json: "):
        Topology.from_json('{"nodes": [{"id": "a", "kind": "gpu"}], "links": [{"source": "a", "target": "b", "kind": "pcie", "bw_bytes_per_s": 1}]}', "j.json")


def test_export_keeps_non_default_latencies():
    b = TopologyBuilder("measured")
    b.add_node(Node("cpu0", NodeKind.CPU, numa=0))
    b.add_node(Node("nic0", NodeKind.NIC, name="mlx5_0", numa=0, busid="0000:03:00.0"))
    b.add_node(Node("net0", NodeKind.NET_SWITCH))
    b.add_link("nic0", "net0", LinkKind.NET, 12.5e9, latency_s=4e-6)
    for i in range(2):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU, rank=i, numa=0, busid=f"0000:0{i + 1}:00.0"))
        b.add_link(f"gpu{i}", "cpu0", LinkKind.PCIE, PCIE_GEN3_X16, latency_s=2.5e-6)
    b.add_link("nic0", "cpu0", LinkKind.PCIE, PCIE_GEN3_X16, latency_s=1e-6)
    b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 50e9, latency_s=0.9e-6, count=2)
    topo = b.build()
    assert parse_nccl_xml(to_nccl_xml(topo), "m.xml").to_json() == topo.to_json()


@pytest.mark.parametrize(
    "cpu_attrs, figure",
    [
        ('vendor="GenuineIntel" familyid="6" modelid="63"', 6 * GB),  # Haswell, before 0x55: QPI_BW
        ('vendor="GenuineIntel" familyid="6" modelid="85"', 10 * GB),  # Skylake 0x55: SKL_QPI_BW
        ('vendor="AuthenticAMD" familyid="25" modelid="1"', 16 * GB),  # AMD_BW
        ('arch="arm64"', 6 * GB),  # ARM_BW
        ('arch="ppc64"', 32 * GB),  # P9_BW
    ],
)
def test_smp_figure_follows_nccl(cpu_attrs, figure):
    text = f'<system version="1"><cpu numaid="0" {cpu_attrs}/><cpu numaid="1" {cpu_attrs}/></system>'
    topo = parse_nccl_xml(text, "smp.xml")
    assert topo.capacity("cpu0", "cpu1") == figure == topo.capacity("cpu1", "cpu0")
    assert parse_nccl_xml(to_nccl_xml(topo), "again.xml").to_json() == topo.to_json()


def test_export_of_an_nvidia_smi_import_keeps_ids_and_links():
    from topocoll.topo.nvidia_smi import parse_nvidia_smi

    name = "v100-sxm2-8gpu-2nic-handedited.nvidia-smi-topo.txt"
    topo = parse_nvidia_smi(fixture_text(name), name)
    back = parse_nccl_xml(to_nccl_xml(topo), "smi.xml")
    assert [n.id for n in back.nodes] == [n.id for n in topo.nodes]
    assert [(l.src, l.dst, l.kind, l.bw_bytes_per_s, l.count, l.latency_s) for l in back.links] == [
        (l.src, l.dst, l.kind, l.bw_bytes_per_s, l.count, l.latency_s) for l in topo.links
    ]
    assert back.notes == topo.notes and back.name == topo.name


def test_names_and_notes_survive_comment_syntax():
    b = TopologyBuilder("a--b & c-")
    b.add_node(Node("cpu0", NodeKind.CPU, numa=0))
    b.note("odd -- note &#45; with --- dashes -")
    topo = b.build()
    text = to_nccl_xml(topo)
    ET.fromstring(text.split("\n", 3)[-1])  # the body is well-formed
    assert parse_nccl_xml(text, "c.xml").to_json() == topo.to_json()


def test_nvswitch_listed_as_pci_device():
    text = """<system version="1"><cpu numaid="0">
      <pci busid="0000:c0:00.0" class="0x068000" link_speed="8 GT/s" link_width="4"/>
      <pci busid="0000:01:00.0" class="0x030200" link_speed="16 GT/s" link_width="16">
        <gpu sm="90" rank="0"><nvlink target="0000:c0:00.0" count="18" tclass="0x068000"/></gpu></pci>
    </cpu></system>"""
    topo = parse_nccl_xml(text, "sw.xml")
    (switch,) = topo.nodes_of(NodeKind.NVSWITCH)
    assert switch.busid == "0000:c0:00.0" and pcie_parent(topo, switch.id) == "cpu0"
    assert topo.link("gpu0", switch.id).count == 18 and nvlink_bw(topo, "gpu0") == 18 * 25 * GB
    assert parse_nccl_xml(to_nccl_xml(topo), "again.xml").to_json() == topo.to_json()
