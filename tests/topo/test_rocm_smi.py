"""``rocm-smi --showtopo`` import, on the real MI308X output of the shared fixtures."""

from __future__ import annotations

import pytest

from tests.topo.fixtures import GB, fixture_text, ids_of, out_links, pcie_parent
from topocoll.errors import FormatError
from topocoll.topo.model import LinkKind, NodeKind, Topology
from topocoll.topo.rocm_smi import parse_rocm_smi

NAME = "amd-mi308x-8gpu.rocm-smi-showtopo.txt"


def test_mi308x_all_to_all_xgmi():
    topo = parse_rocm_smi(fixture_text(NAME), NAME)
    gpus = ids_of(topo, NodeKind.GPU)
    assert gpus == [f"gpu{i}" for i in range(8)]
    # Link Type matrix: XGMI between every pair, hops 1: 7 links from every GPU
    for gpu in gpus:
        links = out_links(topo, gpu, LinkKind.XGMI)
        assert len(links) == 7
        # "MI308X" named in the text: MI300 family, 128 GB/s bidirectional per link (AMD data sheet)
        assert all(link.bw_bytes_per_s == 64 * GB for link in links)
    # Numa Nodes: GPU[0..3] on node 0, GPU[4..7] on node 1
    assert {g.id: g.numa for g in topo.nodes_of(NodeKind.GPU)} == {f"gpu{i}": i // 4 for i in range(8)}
    assert {pcie_parent(topo, g) for g in gpus[:4]} == {"cpu0"}
    assert topo.has_link("cpu0", "cpu1")
    assert Topology.from_json(topo.to_json(), "r.json").to_json() == topo.to_json()


SMALL = """\
=============== Hops between two GPUs ===============
       GPU0   GPU1   GPU2
GPU0   0      1      2
GPU1   1      0      1
GPU2   2      1      0
=============== Link Type between two GPUs ===============
       GPU0   GPU1   GPU2
GPU0   0      XGMI   XGMI
GPU1   XGMI   0      PCIE
GPU2   XGMI   PCIE   0
"""


def test_multi_hop_and_pcie_pairs_get_no_direct_link():
    topo = parse_rocm_smi(SMALL, "small.txt")
    xgmi = {(l.src, l.dst) for l in topo.links if l.kind is LinkKind.XGMI}
    assert xgmi == {("gpu0", "gpu1"), ("gpu1", "gpu0")}
    assert any("2 hops" in n for n in topo.notes)
    assert any("MI300 family assumed" in n for n in topo.notes)  # no product in the text


def test_damaged_row_names_line():
    with pytest.raises(FormatError, match=r"^d\.txt: line 4: row GPU1 has 2 values, expected 3"):
        parse_rocm_smi(SMALL.replace("GPU1   1      0      1", "GPU1   1      0"), "d.txt")


def test_unknown_link_type():
    with pytest.raises(FormatError, match=r"^k\.txt: unknown link type 'WIRE'"):
        parse_rocm_smi(SMALL.replace("PCIE   0", "WIRE   0").replace("0      PCIE", "0      WIRE"), "k.txt")


def test_no_matrix():
    with pytest.raises(FormatError, match=r"^n\.txt: no 'Link Type between two GPUs' matrix"):
        parse_rocm_smi("ROCm System Management Interface\n", "n.txt")
