"""Completing a cloud NCCL topology file with discovery, and the warnings of unknown links."""

from __future__ import annotations

import re

import pytest

from tests.topo.fake_host import host_from_nccl_xml
from tests.topo.fixtures import TOPOLOGY_DIR
from tests.topo.test_discover import comparable
from topocoll.cli import main
from topocoll.solver.bound import cut_bound
from topocoll.solver.schedule import Collective
from topocoll.topo import bandwidth as bw
from topocoll.topo.discover import discover_host
from topocoll.topo.io import load_topology
from topocoll.topo.merge import merge_topologies, planning_warnings
from topocoll.topo.model import LinkKind, NodeKind
from topocoll.topo.nccl_xml import parse_nccl_xml

NDV5 = "azure-ndv5-h100.nccl-topo.xml"
NVSWITCHES = ("0000:c0:00.0", "0000:c1:00.0", "0000:c2:00.0", "0000:c3:00.0")
#: Links of one H100 SXM to each NVSwitch of an HGX H100 board (18 in all: 5, 4, 4, 5).
LINKS_PER_SWITCH = (5, 4, 4, 5)


def with_nvlinks(text: str) -> str:
    """The NDv5 file as the machine is: every GPU an sm 90 with 18 NVLinks to 4 NVSwitches."""
    nvlinks = "".join(
        f'<nvlink target="{switch}" count="{count}" tclass="0x068000"/>' for switch, count in zip(NVSWITCHES, LINKS_PER_SWITCH)
    )
    return re.sub(r'(<pci busid="[^"]+" class="0x030200"[^>]*?)/>', rf'\1><gpu sm="90">{nvlinks}</gpu></pci>', text)


@pytest.fixture
def ndv5(tmp_path):
    text = (TOPOLOGY_DIR / NDV5).read_text()
    host = host_from_nccl_xml(with_nvlinks(text), tmp_path)
    found = discover_host(host.sysfs, host.proc, host_id="ndv5", nvml=host.nvml, arch=host.arch)
    return parse_nccl_xml(text, NDV5), found


def test_cloud_file_without_nvlinks_warns():
    given = load_topology(TOPOLOGY_DIR / NDV5)
    (warning,) = planning_warnings(given)
    assert "NVLink" in warning and "topocoll topo merge" in warning
    assert planning_warnings(load_topology(TOPOLOGY_DIR / "hgx-h800-8gpu-8nic.nccl-topo.xml")) == []


def test_merge_adds_the_nvlinks_discovery_saw(ndv5):
    given, found = ndv5
    merged = merge_topologies(given, found)
    assert planning_warnings(merged) == []
    # the file's nodes and ids are kept; the NVSwitches come from discovery
    assert {n.id for n in given.nodes} <= {n.id for n in merged.nodes}
    assert merged.summary_counts()["nvswitch"] == 4
    per_link = bw.nvlink_bw_bytes_per_s(bw.nvlink_generation_for_sm(90))
    for gpu in merged.nodes_of(NodeKind.GPU):
        nvlinks = [l for l in merged.links if l.src == gpu.id and l.kind is LinkKind.NVLINK]
        assert sorted(l.count for l in nvlinks) == sorted(LINKS_PER_SWITCH)
        assert sum(l.bw_bytes_per_s for l in nvlinks) == pytest.approx(18 * per_link)
    # every PCIe, SMP and NET link of the file is there unchanged
    merged_links = {(l.src, l.dst): l for l in merged.links}
    for link in given.links:
        assert merged_links[(link.src, link.dst)] == link
    # the bound is no longer PCIe's: NVLink carries allreduce at many times its speed
    ranks = list(merged.compute_nodes())
    before = cut_bound(given, Collective.ALLREDUCE, ranks).algbw_bytes_per_s
    after = cut_bound(merged, Collective.ALLREDUCE, ranks).algbw_bytes_per_s
    assert after > 10 * before
    assert any(note.startswith("completed from discovered:ndv5: added 4 nvswitch node(s)") for note in merged.notes)


def test_merge_with_the_same_machine_changes_nothing(tmp_path):
    name = "hgx-h800-8gpu-8nic.nccl-topo.xml"
    text = (TOPOLOGY_DIR / name).read_text()
    host = host_from_nccl_xml(text, tmp_path)
    found = discover_host(host.sysfs, host.proc, host_id="h", nvml=host.nvml, arch=host.arch)
    given = parse_nccl_xml(text, name)
    merged = merge_topologies(given, found)
    assert comparable(merged) == comparable(given)
    assert any("added nothing" in note for note in merged.notes)


def test_merge_notes_gpus_the_machine_lacks(ndv5):
    given, found = ndv5
    other = parse_nccl_xml((TOPOLOGY_DIR / "hgx-h800-8gpu-8nic.nccl-topo.xml").read_text(), "h800")
    merged = merge_topologies(other, found)
    assert any("GPU(s) of the given file not seen by discovery" in note for note in merged.notes)


def test_cli_merge_then_synthesize_has_no_warning(ndv5, tmp_path, capsys):
    given, found = ndv5
    discovered = tmp_path / "node.json"
    discovered.write_text(found.to_json())
    out = tmp_path / "complete.json"
    assert main(["topo", "merge", str(TOPOLOGY_DIR / NDV5), str(discovered), "-o", str(out)]) == 0
    assert load_topology(out).summary_counts()["nvswitch"] == 4
    capsys.readouterr()
    assert main(["synthesize", "--topology", str(TOPOLOGY_DIR / NDV5), "--collective", "allgather", "--size", "1M", "-o", str(tmp_path / "a.json")]) == 0
    assert "warning:" in capsys.readouterr().err
    assert main(["synthesize", "--topology", str(out), "--collective", "allgather", "--size", "1M", "-o", str(tmp_path / "b.json")]) == 0
    assert "warning:" not in capsys.readouterr().err
    assert main(["topo", "show", str(TOPOLOGY_DIR / NDV5)]) == 0
    assert "topo merge" in capsys.readouterr().err


def test_cli_merge_bad_input_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    out = tmp_path / "out.json"
    assert main(["topo", "merge", str(bad), str(TOPOLOGY_DIR / NDV5), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "Traceback" not in err
    assert not out.exists()
