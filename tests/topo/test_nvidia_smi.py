"""``nvidia-smi topo -m`` import, on every real nvidia-smi file of the shared fixtures and on
hand-written outputs of the newer format. Expected values come from reading the matrices."""

from __future__ import annotations

import pytest

from tests.topo.fixtures import GB, fixture_text, ids_of, nvlink_bw, nvlink_count, pcie_parent
from topocoll.errors import FormatError
from topocoll.topo.model import LinkKind, NodeKind, Topology
from topocoll.topo.nvidia_smi import parse_nvidia_smi


def load(name: str) -> Topology:
    return parse_nvidia_smi(fixture_text(name), name)


def nv_pairs(topo: Topology) -> dict[tuple[int, int], int]:
    return {
        (int(l.src[3:]), int(l.dst[3:])): l.count
        for l in topo.links
        if l.kind is LinkKind.NVLINK and l.src < l.dst and l.dst.startswith("gpu")
    }


def test_dgx1_hybrid_cube_mesh():
    topo = load("dgx1-v100-1nic.nvidia-smi-topo.txt")
    assert len(topo.nodes_of(NodeKind.GPU)) == 8
    # row GPU0: NV1 NV1 NV2 NV2 to GPU1..GPU4; row GPU4: NV2 to GPU0, NV1 NV1 NV2 to GPU5..7
    pairs = nv_pairs(topo)
    assert pairs[(0, 1)] == 1 and pairs[(0, 2)] == 1 and pairs[(0, 3)] == 2 and pairs[(0, 4)] == 2
    assert (0, 5) not in pairs  # SYS
    assert pairs[(4, 7)] == 2 and pairs[(6, 7)] == 2 and len(pairs) == 16
    assert [topo.node(f"gpu{i}").index for i in range(8)] == list(range(8))  # the GPU<i> columns
    for gpu in ids_of(topo, NodeKind.GPU):  # every row sums to 6 NVLinks (V100 has 6)
        assert nvlink_count(topo, gpu) == 6
        assert nvlink_bw(topo, gpu) == pytest.approx(150 * GB)  # "Tesla V100" in the text: 25 GB/s
    # mlx5_0 is PIX to GPU2 and GPU3: one switch for the three
    (nic,) = topo.nodes_of(NodeKind.NIC)
    assert nic.name == "mlx5_0"
    switch = pcie_parent(topo, nic.id)
    assert topo.node(switch).kind is NodeKind.PCIE_SWITCH
    assert pcie_parent(topo, "gpu2") == switch == pcie_parent(topo, "gpu3")
    # CPU Affinity 0-11,24-35 for GPU0-3 and 12-23,36-47 for GPU4-7: two NUMA nodes, SYS apart
    numa = {g.id: g.numa for g in topo.nodes_of(NodeKind.GPU)}
    assert len({numa[f"gpu{i}"] for i in range(4)}) == 1 and len({numa[f"gpu{i}"] for i in range(4, 8)}) == 1
    assert numa["gpu0"] != numa["gpu4"] and nic.numa == numa["gpu2"]
    (smp,) = [l for l in topo.links if l.kind is LinkKind.SMP and l.src < l.dst]
    assert {smp.src, smp.dst} == {f"cpu{numa['gpu0']}", f"cpu{numa['gpu4']}"}


def test_v100_old_legend_lost_indentation():
    topo = load("v100-sxm2-8gpu-1numa-oldlegend.nvidia-smi-topo.txt")
    pairs = nv_pairs(topo)
    # row GPU0: NV2 NV2 NV1 NV1 to GPU1..GPU4, NODE to the rest
    assert [pairs.get((0, j)) for j in range(1, 8)] == [2, 2, 1, 1, None, None, None]
    assert all(nvlink_count(topo, g) == 6 for g in ids_of(topo, NodeKind.GPU))
    assert ids_of(topo, NodeKind.CPU) == ["cpu0"]  # CPU Affinity 0-23 everywhere, no SYS
    assert not topo.nodes_of(NodeKind.PCIE_SWITCH)  # no PIX/PXB anywhere
    assert pcie_parent(topo, "nic0") == "cpu0"


def test_v100_hand_edited_whitespace_and_numa_column():
    topo = load("v100-sxm2-8gpu-2nic-handedited.nvidia-smi-topo.txt")
    pairs = nv_pairs(topo)
    # row GPU0: NV1 NV2 NV1 to GPU1..3, SYS SYS SYS, NV2 to GPU7
    assert [pairs.get((0, j)) for j in range(1, 8)] == [1, 2, 1, None, None, None, 2]
    assert all(nvlink_count(topo, g) == 6 for g in ids_of(topo, NodeKind.GPU))
    # NUMA Affinity column: 0 for GPU0-3, 1 for GPU4-7
    assert {g.id: g.numa for g in topo.nodes_of(NodeKind.GPU)} == {f"gpu{i}": i // 4 for i in range(8)}
    nics = {n.name: n for n in topo.nodes_of(NodeKind.NIC)}
    assert set(nics) == {"mlx5_0", "mlx5_1"}
    # mlx5_0 PIX to GPU2, GPU3; mlx5_1 PIX to GPU6, GPU7
    assert pcie_parent(topo, nics["mlx5_0"].id) == pcie_parent(topo, "gpu2") == pcie_parent(topo, "gpu3")
    assert pcie_parent(topo, nics["mlx5_1"].id) == pcie_parent(topo, "gpu6") == pcie_parent(topo, "gpu7")
    assert (nics["mlx5_0"].numa, nics["mlx5_1"].numa) == (0, 1)
    assert len(topo.nodes_of(NodeKind.PCIE_SWITCH)) == 2
    assert any("PCIe generation" in n for n in topo.notes)


NEWER = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tNV18\tNV18\tPXB\tSYS\t0-47\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tNV18\tPXB\tSYS\t0-47\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tNV18\tSYS\tPIX\t48-95\t1\t\tN/A
GPU3\tNV18\tNV18\tNV18\t X \tSYS\tPIX\t48-95\t1\t\tN/A
NIC0\tPXB\tPXB\tSYS\tSYS\t X \tSYS
NIC1\tSYS\tSYS\tPIX\tPIX\tSYS\t X

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_3
"""


def test_newer_format_nic_legend_and_nvswitch():
    topo = parse_nvidia_smi(NEWER, "h100.txt")
    # NV18 between all 4 GPUs = 54 links per GPU, more than 18: one NVSwitch, 18 links each
    (switch,) = ids_of(topo, NodeKind.NVSWITCH)
    for gpu in ids_of(topo, NodeKind.GPU):
        assert topo.link(gpu, switch).count == 18 and nvlink_count(topo, gpu) == 18
    assert [n.name for n in topo.nodes_of(NodeKind.NIC)] == ["mlx5_0", "mlx5_3"]
    # NIC0 is PXB to GPU0 and GPU1: a switch above all three (no PIX: no lower level)
    up = pcie_parent(topo, "nic0")
    assert topo.node(up).kind is NodeKind.PCIE_SWITCH and pcie_parent(topo, "gpu0") == up
    # NIC1 PIX to GPU2, GPU3
    assert pcie_parent(topo, "nic1") == pcie_parent(topo, "gpu2") == pcie_parent(topo, "gpu3")
    assert {g.numa for g in topo.nodes_of(NodeKind.GPU)} == {0, 1}
    assert any("no GPU model" in n for n in topo.notes)


def test_pxb_builds_two_levels_and_soc_means_sys():
    text = """GPU0 GPU1 GPU2 GPU3 GPU4 CPU Affinity
GPU0 X PIX PXB PXB SOC 0-7
GPU1 PIX X PXB PXB SOC 0-7
GPU2 PXB PXB X PIX SOC 0-7
GPU3 PXB PXB PIX X SOC 0-7
GPU4 SOC SOC SOC SOC X 8-15
"""
    topo = parse_nvidia_smi(text, "pxb.txt")
    leaf_a, leaf_b = pcie_parent(topo, "gpu0"), pcie_parent(topo, "gpu2")
    assert leaf_a != leaf_b and pcie_parent(topo, "gpu1") == leaf_a and pcie_parent(topo, "gpu3") == leaf_b
    top = pcie_parent(topo, leaf_a)
    assert top == pcie_parent(topo, leaf_b) and topo.node(top).kind is NodeKind.PCIE_SWITCH
    assert pcie_parent(topo, "gpu4") != pcie_parent(topo, top)  # SOC: the other socket
    assert len(topo.nodes_of(NodeKind.CPU)) == 2


def test_gpu_names_from_listing_set_generation():
    text = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\nGPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2)\n" \
           "      GPU0  GPU1  CPU Affinity\nGPU0   X    NV12  0-7\nGPU1  NV12   X    0-7\n"
    topo = parse_nvidia_smi(text, "a100.txt")
    assert topo.node("gpu0").name == "NVIDIA A100-SXM4-40GB"
    assert topo.link("gpu0", "gpu1").bw_bytes_per_s == 12 * 25 * GB  # 12 <= 18: direct links


def test_no_affinity_columns_numa_from_sys():
    text = "GPU0 GPU1 GPU2\nGPU0 X PHB SYS\nGPU1 PHB X SYS\nGPU2 SYS SYS X\n"
    topo = parse_nvidia_smi(text, "noaff.txt")
    assert topo.node("gpu0").numa == topo.node("gpu1").numa != topo.node("gpu2").numa
    assert any("guessed" in n for n in topo.notes)


def test_short_row_names_file_and_line():
    text = "# comment\nGPU0 GPU1 CPU Affinity\nGPU0 X NV1 0-3\nGPU1 NV1\n"
    with pytest.raises(FormatError, match=r"^s\.txt: line 4: row GPU1 has 1 cells, expected 2"):
        parse_nvidia_smi(text, "s.txt")


def test_unknown_relation_names_file_and_line():
    text = "GPU0 GPU1\nGPU0 X BOGUS\nGPU1 PIX X\n"
    with pytest.raises(FormatError, match=r"^u\.txt: line 2: unknown relation 'BOGUS' between GPU0 and GPU1"):
        parse_nvidia_smi(text, "u.txt")


def test_not_a_matrix():
    with pytest.raises(FormatError, match=r"^x\.txt: no nvidia-smi topo -m header"):
        parse_nvidia_smi("hello\nworld\n", "x.txt")
