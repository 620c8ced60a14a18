"""Presets against the public specifications of the systems they describe.

Expected values come from the vendors' published figures (GPU and link counts, total NVLink
bandwidth per GPU) and, for the DGX-1 wiring, from a real ``nvidia-smi topo -m`` output read
by a small parser written here.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from topocoll.errors import TopologyError
from topocoll.topo import presets
from topocoll.topo.model import LinkKind, NodeKind, Topology
from tests.topo.fixtures import TOPOLOGY_DIR

GB = 1e9
FIXTURES = TOPOLOGY_DIR

# name: (GPUs, NVLinks per GPU, NVLink bandwidth per GPU in both directions from the vendor's
# whitepaper: V100 300 GB/s, A100 600 GB/s, H100 900 GB/s)
SPECS = {
    "dgx1-v100": (8, 6, 300 * GB),
    "dgx2": (16, 6, 300 * GB),
    "dgx-a100": (8, 12, 600 * GB),
    "dgx-h100": (8, 18, 900 * GB),
    "pcie-8gpu": (8, 0, 0.0),
    "mi300x": (8, 0, 0.0),
}


def _out(topo: Topology, node_id: str, kind: LinkKind):
    return [l for l in topo.links if l.src == node_id and l.kind is kind]


def _pcie_x16_bw(gt_per_s: float, encoding: float) -> float:
    return gt_per_s * 1e9 * encoding * 16 / 8


def test_registry_lists_the_required_presets():
    assert set(SPECS) <= set(presets.PRESETS)
    for name, spec in presets.PRESETS.items():
        assert spec.name == name
        assert spec.description and "\n" not in spec.description


@pytest.mark.parametrize("name", sorted(SPECS))
def test_gpu_counts_ranks_and_ids(name):
    gpus_expected, _, _ = SPECS[name]
    topo = presets.build_preset(name)
    gpus = topo.nodes_of(NodeKind.GPU)
    assert len(gpus) == gpus_expected == presets.PRESETS[name].gpus
    assert topo.compute_nodes() == tuple(f"gpu{i}" for i in range(gpus_expected))
    assert [topo.node(f"gpu{i}").rank for i in range(gpus_expected)] == list(range(gpus_expected))
    assert len(topo.nodes_of(NodeKind.CPU)) == 2
    assert topo.link("cpu0", "cpu1").kind is LinkKind.SMP
    # every link is full duplex with the same figures both ways
    for link in topo.links:
        back = topo.link(link.dst, link.src)
        assert (back.kind, back.bw_bytes_per_s, back.count) == (link.kind, link.bw_bytes_per_s, link.count)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_nvlinks_per_gpu_and_bandwidth_match_public_specs(name):
    gpus, links_per_gpu, total_bidirectional = SPECS[name]
    topo = presets.build_preset(name)
    for i in range(gpus):
        nvlinks = _out(topo, f"gpu{i}", LinkKind.NVLINK)
        assert sum(l.count for l in nvlinks) == links_per_gpu
        assert sum(l.bw_bytes_per_s for l in nvlinks) == pytest.approx(total_bidirectional / 2)


def _read_nv_matrix(path: Path) -> dict[tuple[int, int], int]:
    """NV# entries of an ``nvidia-smi topo -m`` matrix: {(gpu a, gpu b): links}."""
    pairs: dict[tuple[int, int], int] = {}
    header: list[str] | None = None
    for line in path.read_text().splitlines():
        cells = line.split()
        if header is None:
            if cells and cells[0] == "GPU0":
                header = cells
            continue
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            if cells and cells[0] == "Legend:":
                break
            continue
        a = int(cells[0][3:])
        for column, cell in zip(header, cells[1:]):
            match = re.fullmatch(r"NV(\d+)", cell)
            if match and column.startswith("GPU"):
                pairs[(a, int(column[3:]))] = int(match.group(1))
    return pairs


def test_dgx1_wiring_matches_nvidia_smi_of_a_real_dgx1():
    fixture = FIXTURES / "dgx1-v100-1nic.nvidia-smi-topo.txt"
    if not fixture.exists():
        pytest.skip(f"fixture {fixture.name} not available")
    expected = _read_nv_matrix(fixture)
    assert len(expected) == 2 * 16  # 16 linked pairs, both triangles of the matrix
    topo = presets.dgx1_v100()
    actual = {}
    for link in topo.links:
        if link.kind is LinkKind.NVLINK:
            actual[(int(link.src[3:]), int(link.dst[3:]))] = link.count
    assert actual == expected
    per_link = 25 * GB  # NVLink 2: 300 GB/s over 6 links, both directions
    for (a, b), count in expected.items():
        assert topo.link(f"gpu{a}", f"gpu{b}").bw_bytes_per_s == pytest.approx(count * per_link)


def test_dgx1_host_side():
    topo = presets.dgx1_v100()
    assert len(topo.nodes_of(NodeKind.NIC)) == 4
    assert len(topo.nodes_of(NodeKind.PCIE_SWITCH)) == 4
    # GPU pairs share a PCIe switch; each switch has one NIC
    for s in range(4):
        below = sorted(l.src for l in topo.links if l.dst == f"pcie_switch{s}" and l.kind is LinkKind.PCIE)
        assert below == sorted([f"gpu{2 * s}", f"gpu{2 * s + 1}", f"nic{s}", f"cpu{s // 2}"])
    assert topo.link("gpu0", "pcie_switch0").bw_bytes_per_s == pytest.approx(_pcie_x16_bw(8.0, 128 / 130))


def test_dgx2_nvswitch_fabric():
    topo = presets.dgx2()
    switches = topo.nodes_of(NodeKind.NVSWITCH)
    assert len(switches) == 12
    for g in range(16):
        board = g // 8
        targets = {l.dst: l.count for l in _out(topo, f"gpu{g}", LinkKind.NVLINK)}
        assert targets == {f"nvswitch{s}": 1 for s in range(6 * board, 6 * board + 6)}
    for s in range(6):
        assert topo.link(f"nvswitch{s}", f"nvswitch{s + 6}").count == 8
    # NVSwitch chips have 18 NVLink ports; 8 go to GPUs and 8 across the baseboards
    for switch in switches:
        used = sum(l.count for l in _out(topo, switch.id, LinkKind.NVLINK))
        assert used == 16 <= 18


def test_dgx_a100_switches_and_nics():
    topo = presets.dgx_a100()
    assert len(topo.nodes_of(NodeKind.NVSWITCH)) == 6
    for g in range(8):
        targets = {l.dst: l.count for l in _out(topo, f"gpu{g}", LinkKind.NVLINK)}
        assert targets == {f"nvswitch{s}": 2 for s in range(6)}
    nics = topo.nodes_of(NodeKind.NIC)
    assert len(nics) == 8
    assert presets.PRESETS["dgx-a100"].nic_bw_bytes_per_s == pytest.approx(200e9 / 8)  # HDR
    for nic in nics:
        (switch,) = [l.dst for l in _out(topo, nic.id, LinkKind.PCIE)]
        gpus_there = [l.src for l in topo.links if l.dst == switch and l.src.startswith("gpu")]
        assert len(gpus_there) == 2
    assert topo.link("gpu0", "pcie_switch0").bw_bytes_per_s == pytest.approx(_pcie_x16_bw(16.0, 128 / 130))
    assert topo.link("cpu0", "cpu1").bw_bytes_per_s == pytest.approx(16 * GB)  # NCCL AMD_BW


def test_dgx_h100_links_per_switch():
    topo = presets.dgx_h100()
    assert len(topo.nodes_of(NodeKind.NVSWITCH)) == 4
    for g in range(8):
        counts = sorted(l.count for l in _out(topo, f"gpu{g}", LinkKind.NVLINK))
        assert counts == [4, 4, 5, 5]
    for s in range(4):
        per_gpu = {l.dst: l.count for l in _out(topo, f"nvswitch{s}", LinkKind.NVLINK)}
        assert len(per_gpu) == 8 and len(set(per_gpu.values())) == 1
    assert len(topo.nodes_of(NodeKind.NIC)) == 8
    assert presets.PRESETS["dgx-h100"].nic_bw_bytes_per_s == pytest.approx(400e9 / 8)  # NDR
    assert topo.link("gpu3", "pcie_switch3").bw_bytes_per_s == pytest.approx(_pcie_x16_bw(32.0, 128 / 130))


def test_pcie_box_has_no_nvlink():
    topo = presets.pcie_8gpu()
    assert not [l for l in topo.links if l.kind is LinkKind.NVLINK]
    assert len(topo.nodes_of(NodeKind.PCIE_SWITCH)) == 2
    below = Counter(l.dst for l in topo.links if l.src.startswith("gpu"))
    assert below == {"pcie_switch0": 4, "pcie_switch1": 4}
    assert topo.link("pcie_switch0", "cpu0").kind is LinkKind.PCIE
    assert topo.link("pcie_switch1", "cpu1").kind is LinkKind.PCIE


def test_mi300x_full_mesh():
    topo = presets.mi300x()
    xgmi = [l for l in topo.links if l.kind is LinkKind.XGMI]
    pairs = {tuple(sorted((l.src, l.dst))) for l in xgmi}
    assert len(pairs) == 8 * 7 // 2
    assert all(l.count == 1 for l in xgmi)
    # AMD: 7 links per GPU, 896 GB/s aggregate (both directions)
    for g in range(8):
        mine = _out(topo, f"gpu{g}", LinkKind.XGMI)
        assert len(mine) == 7
        assert sum(l.bw_bytes_per_s for l in mine) == pytest.approx(896 * GB / 2)


def test_nic_count_can_be_chosen_and_spreads_over_switches():
    topo = presets.PRESETS["dgx-h100"].build(nics=2)
    nics = topo.nodes_of(NodeKind.NIC)
    assert [n.id for n in nics] == ["nic0", "nic1"]
    switches = [l.dst for n in nics for l in _out(topo, n.id, LinkKind.PCIE)]
    assert switches == ["pcie_switch0", "pcie_switch4"]
    assert [n.numa for n in nics] == [0, 1]
    assert not presets.PRESETS["dgx-h100"].build(nics=0).nodes_of(NodeKind.NIC)
    with pytest.raises(TopologyError, match="NICs"):
        presets.PRESETS["dgx-h100"].build(nics=-1)


def test_unknown_preset_lists_known_names():
    with pytest.raises(TopologyError, match="unknown preset 'dgx-9000'; known: .*dgx-h100"):
        presets.get_preset("dgx-9000")


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_presets_round_trip_through_json(name):
    topo = presets.build_preset(name)
    assert topo.name == name
    again = Topology.from_json(topo.to_json())
    assert again.to_json() == topo.to_json()
    assert again.digest() == topo.digest()
