"""The topology picture with a link load (the simulator's --png)."""

from __future__ import annotations

from topocoll.topo.cluster import make_cluster
from topocoll.topo.draw import _edge_utilisation, draw_topology
from topocoll.topo.presets import build_preset

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_an_edge_shows_the_busier_of_its_two_directions():
    topo = build_preset("dgx1-v100")
    use = {("gpu0", "gpu1"): 0.25, ("gpu1", "gpu0"): 0.75, ("gpu2", "gpu3"): 0.5}
    assert _edge_utilisation(topo, False, use) == {("gpu0", "gpu1"): 0.75, ("gpu2", "gpu3"): 0.5}


def test_collapsed_machines_show_their_busiest_link_and_hide_inner_ones():
    topo = make_cluster("dgx-h100", 2)
    use = {("n0.nic3", "leaf3"): 0.4, ("n0.nic5", "leaf5"): 0.9, ("n0.gpu0", "n0.nvswitch0"): 1.0}
    assert _edge_utilisation(topo, True, use) == {("leaf3", "n0"): 0.4, ("leaf5", "n0"): 0.9}


def test_a_load_picture_is_written(tmp_path):
    topo = build_preset("dgx1-v100")
    use = {(link.src, link.dst): (i % 5) / 4 for i, link in enumerate(topo.links)}
    path = tmp_path / "load.png"
    draw_topology(topo, path, link_utilisation=use, title="load")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
