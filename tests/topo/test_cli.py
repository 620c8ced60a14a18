"""``topocoll topo ...``: in-process through ``topocoll.cli.main`` and as a real process for exit codes."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from topocoll.cli import main
from topocoll.topo.model import LinkKind, NodeKind, Topology
from topocoll.topo.presets import PRESETS, dgx_h100
from tests.topo.fixtures import TOPOLOGY_DIR

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIXTURES = TOPOLOGY_DIR


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "topocoll.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_list_presets(capsys):
    assert main(["topo", "list-presets"]) == 0
    out = capsys.readouterr().out
    for name, spec in PRESETS.items():
        assert name in out
        assert str(spec.gpus) in out


def test_preset_writes_json_equal_to_the_library(tmp_path, capsys):
    out = tmp_path / "h100.json"
    assert main(["topo", "preset", "dgx-h100", "-o", str(out)]) == 0
    topo = Topology.from_json(out.read_text())
    assert topo.digest() == dgx_h100().digest()
    assert "wrote" in capsys.readouterr().out


def test_preset_cluster_options(tmp_path):
    out = tmp_path / "c.json"
    args = ["topo", "preset", "dgx-a100", "--nodes", "3", "--nics-per-node", "4", "--network", "fat-tree"]
    args += ["--nic-gbit", "100", "--oversubscription", "2", "--switch-radix", "6", "-o", str(out)]
    assert main(args) == 0
    topo = Topology.from_json(out.read_text())
    assert len(topo.nodes_of(NodeKind.GPU)) == 24
    assert len(topo.nodes_of(NodeKind.NIC)) == 12
    nic_links = [l for l in topo.links if l.kind is LinkKind.NET and topo.node(l.src).kind is NodeKind.NIC]
    assert {l.bw_bytes_per_s for l in nic_links} == {100e9 / 8}
    for leaf in (n.id for n in topo.nodes_of(NodeKind.NET_SWITCH) if n.id.startswith("leaf")):
        down = sum(l.bw_bytes_per_s for l in nic_links if l.dst == leaf)
        up = sum(l.bw_bytes_per_s for l in topo.links if l.src == leaf and l.dst.startswith("spine"))
        assert down / up == pytest.approx(2.0)


def test_show_summarizes_gpus_links_and_nics(tmp_path, capsys):
    src = tmp_path / "h100.json"
    src.write_text(dgx_h100().to_json())
    assert main(["topo", "show", str(src)]) == 0
    out = capsys.readouterr().out
    # 8 GPUs x 18 NVLinks = 144 physical NVLinks, 8 x 450 GB/s one way
    nvlink_row = next(line for line in out.splitlines() if "nvlink" in line)
    assert "144" in nvlink_row and "3,600.0" in nvlink_row
    gpu_rows = [line for line in out.splitlines() if "gpu" in line and "H100" in line]
    assert len(gpu_rows) == 8
    assert all("18" in row and "450.0" in row for row in gpu_rows)
    assert out.count("nic") >= 8 and "NDR 400" in out
    assert "NUMA" in out


def test_show_prints_notes(tmp_path, capsys):
    src = tmp_path / "flat.json"
    from topocoll.topo.discover import flat_topology

    src.write_text(flat_topology(3).to_json())
    assert main(["topo", "show", str(src)]) == 0
    out = capsys.readouterr().out
    assert "not known from the source" in out and "assumed" in out


def test_show_png(tmp_path):
    src = tmp_path / "d1.json"
    src.write_text(PRESETS["dgx1-v100"].build().to_json())
    png = tmp_path / "d1.png"
    assert main(["topo", "show", str(src), "--png", str(png)]) == 0
    width, height = _png_size(png)
    assert width >= 600 and height >= 400
    assert png.stat().st_size > 10_000


def test_preset_png_for_a_collapsed_cluster(tmp_path):
    png = tmp_path / "big.png"
    assert main(["topo", "preset", "dgx-h100", "--nodes", "16", "-o", str(tmp_path / "big.json"), "--png", str(png)]) == 0
    assert _png_size(png)[0] >= 600


def test_convert_json_to_json_and_xml(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(dgx_h100().to_json())
    out = tmp_path / "out.json"
    assert main(["topo", "convert", str(src), "-o", str(out)]) == 0
    assert out.read_text() == src.read_text()
    xml = tmp_path / "out.xml"
    assert main(["topo", "convert", str(src), "-o", str(xml)]) == 0
    assert xml.read_text().lstrip().startswith("<")


def test_convert_real_nvidia_smi_file(tmp_path):
    fixture = FIXTURES / "dgx1-v100-1nic.nvidia-smi-topo.txt"
    if not fixture.exists():
        pytest.skip(f"fixture {fixture.name} not available")
    out = tmp_path / "dgx1.json"
    assert main(["topo", "convert", str(fixture), "-o", str(out)]) == 0
    topo = Topology.from_json(out.read_text())
    assert len(topo.nodes_of(NodeKind.GPU)) == 8
    # the file shows NV1/NV2 per pair: every V100 of a DGX-1 uses its 6 NVLinks
    for gpu in topo.nodes_of(NodeKind.GPU):
        assert sum(l.count for l in topo.links if l.src == gpu.id and l.kind is LinkKind.NVLINK) == 6


def test_errors_in_process(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": [], "links": [{"source": "a"}]}')
    out = tmp_path / "out.json"
    assert main(["topo", "convert", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("topocoll: error: ") and "bad.json" in err and err.count("\n") == 1
    assert not out.exists()
    assert main(["topo", "preset", "dgx-h100", "-o", str(tmp_path / "x.yaml")]) == 2
    assert "x.yaml" in capsys.readouterr().err
    assert main(["topo", "preset", "nope", "-o", str(out)]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    assert main(["topo", "preset", "dgx-h100", "--nic-gbit", "-5", "--nodes", "2", "-o", str(out)]) == 2
    assert main(["topo", "show", str(tmp_path / "missing.json")]) == 2
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [bad]


def test_exit_codes_as_a_process(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nodes": [{"id": "gpu0", "kind": "gpu"}], "links": [
        {"source": "gpu0", "target": "gpu1", "kind": "nvlink", "bw_bytes_per_s": 1e9}]}))
    out = tmp_path / "out.json"
    png = tmp_path / "out.png"
    cases = [
        ["topo", "convert", str(bad), "-o", str(out)],  # unknown endpoint
        ["topo", "show", str(bad), "--png", str(png)],
        ["topo", "preset", "dgx-h100", "--nodes", "0", "-o", str(out), "--png", str(png)],
        ["topo", "preset", "dgx-h100", "-o", str(out), "--png", str(tmp_path / "out.jpg")],
    ]
    for args in cases:
        result = _run(*args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("topocoll: error: "), result.stderr
        assert not out.exists() and not png.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]
    ok = _run("topo", "preset", "pcie-8gpu", "-o", str(out), cwd=tmp_path)
    assert ok.returncode == 0 and out.exists()


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as info:
        main(["topo", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "topocoll topo preset" in out
    with pytest.raises(SystemExit):
        main(["topo", "preset", "--help"])
    out = capsys.readouterr().out
    assert "--oversubscription" in out and "--nodes 4" in out


def test_discover_without_gpus_writes_the_machine_and_flat_only_when_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # NVML not installed
    machine = tmp_path / "machine.json"
    assert main(["topo", "discover", "-o", str(machine)]) == 0
    found = Topology.from_json(machine.read_text())
    assert found.compute_nodes() == () and found.summary_counts()["cpu"] >= 1
    assert any("pynvml" in note for note in found.notes)
    assert "pynvml" in capsys.readouterr().out  # the notes are shown
    out = tmp_path / "flat.json"
    assert main(["topo", "discover", "--flat-world-size", "3", "-o", str(out)]) == 0
    topo = Topology.from_json(out.read_text())
    assert topo.compute_nodes() == ("host0", "host1", "host2")
