"""Validation rules and the JSON contract of the topology model."""

from __future__ import annotations

import json
import math
import random

import pytest

from topocoll.errors import TopocollError, TopologyError
from topocoll.topo.model import FORMAT, Link, LinkKind, Node, NodeKind, Topology, TopologyBuilder, natural_key

GB = 1e9


def _pair(bw: float = 25 * GB, latency: float = 1e-6) -> Topology:
    nodes = [Node("gpu0", NodeKind.GPU, rank=0), Node("gpu1", NodeKind.GPU, rank=1)]
    links = [Link("gpu0", "gpu1", LinkKind.NVLINK, bw, latency), Link("gpu1", "gpu0", LinkKind.NVLINK, bw, latency)]
    return Topology(nodes, links)


def _small_dict() -> dict:
    """A valid contract-1 document written by hand (not by the code under test)."""
    return {
        "directed": True,
        "multigraph": False,
        "graph": {"format": FORMAT, "name": "two gpus and a switch"},
        "nodes": [
            {"id": "gpu0", "kind": "gpu", "rank": 0, "numa": 0, "busid": "0000:07:00.0", "name": "A100"},
            {"id": "gpu1", "kind": "gpu", "rank": 1, "numa": 1},
            {"id": "nvswitch0", "kind": "nvswitch"},
        ],
        "links": [
            {"source": "gpu0", "target": "nvswitch0", "kind": "nvlink", "bw_bytes_per_s": 50e9, "latency_s": 6e-7, "count": 2},
            {"source": "nvswitch0", "target": "gpu0", "kind": "nvlink", "bw_bytes_per_s": 50e9, "latency_s": 6e-7, "count": 2},
            {"source": "gpu1", "target": "nvswitch0", "kind": "nvlink", "bw_bytes_per_s": 50e9, "latency_s": 6e-7, "count": 2},
            {"source": "nvswitch0", "target": "gpu1", "kind": "nvlink", "bw_bytes_per_s": 50e9, "latency_s": 6e-7, "count": 2},
        ],
    }


# ------------------------------------------------------------------------------ Link
@pytest.mark.parametrize("bad", [float("nan"), 0, 0.0, -1.0, float("inf"), float("-inf"), True, "25e9", None])
def test_link_rejects_bad_bandwidth(bad):
    with pytest.raises(TopologyError, match="bw_bytes_per_s"):
        Link("a", "b", LinkKind.PCIE, bad)


@pytest.mark.parametrize("bad", [-1e-9, float("nan"), float("inf"), "1us", False])
def test_link_rejects_bad_latency(bad):
    with pytest.raises(TopologyError, match="latency_s"):
        Link("a", "b", LinkKind.PCIE, 1e9, bad)


def test_link_accepts_zero_latency_and_int_bandwidth():
    link = Link("a", "b", LinkKind.PCIE, 10, 0)
    assert link.bw_bytes_per_s == 10 and link.latency_s == 0


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_link_rejects_bad_count(bad):
    with pytest.raises(TopologyError, match="count"):
        Link("a", "b", LinkKind.NVLINK, 1e9, count=bad)


def test_link_rejects_self_loop_and_string_kind():
    with pytest.raises(TopologyError, match="itself"):
        Link("a", "a", LinkKind.PCIE, 1e9)
    with pytest.raises(TopologyError, match="kind"):
        Link("a", "b", "pcie", 1e9)  # type: ignore[arg-type]


def test_records_are_frozen():
    link = Link("a", "b", LinkKind.PCIE, 1e9)
    with pytest.raises(AttributeError):
        link.bw_bytes_per_s = 2e9  # type: ignore[misc]


# ------------------------------------------------------------------------------ Node
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"id": "", "kind": NodeKind.GPU}, "non-empty"),
        ({"id": 3, "kind": NodeKind.GPU}, "non-empty"),
        ({"id": "x", "kind": "gpu"}, "NodeKind"),
        ({"id": "x", "kind": NodeKind.GPU, "rank": -1}, "rank"),
        ({"id": "x", "kind": NodeKind.GPU, "rank": True}, "rank"),
        ({"id": "x", "kind": NodeKind.GPU, "rank": "0"}, "rank"),
        ({"id": "x", "kind": NodeKind.NIC, "rank": 0}, "only gpu/host"),
        ({"id": "x", "kind": NodeKind.GPU, "numa": "0"}, "numa"),
        ({"id": "x", "kind": NodeKind.GPU, "busid": 7}, "busid"),
        ({"id": "x", "kind": NodeKind.GPU, "host_id": 1}, "host_id"),
        ({"id": "x", "kind": NodeKind.GPU, "sm": 0}, "sm must be an integer >= 1"),
        ({"id": "x", "kind": NodeKind.GPU, "sm": "90"}, "sm must be"),
        ({"id": "x", "kind": NodeKind.NIC, "sm": 90}, "only gpu nodes carry an sm"),
        ({"id": "x", "kind": NodeKind.GPU, "index": -1}, "index must be an integer >= 0"),
        ({"id": "x", "kind": NodeKind.HOST, "index": 0}, "only gpu nodes carry an index"),
        ({"id": "x", "kind": NodeKind.GPU, "gdr": 1}, "gdr must be true or false"),
        ({"id": "x", "kind": NodeKind.CPU, "gdr": True}, "only gpu and nic nodes carry gdr"),
    ],
)
def test_node_validation(kwargs, message):
    with pytest.raises(TopologyError, match=message):
        Node(**kwargs)


def test_host_nodes_carry_ranks():
    assert Node("host0", NodeKind.HOST, rank=0).rank == 0
    assert NodeKind.HOST.is_compute and NodeKind.GPU.is_compute and not NodeKind.NVSWITCH.is_compute


# -------------------------------------------------------------------------- Topology
def test_unknown_endpoint():
    with pytest.raises(TopologyError, match="unknown endpoint 'gpu9'"):
        Topology([Node("gpu0", NodeKind.GPU)], [Link("gpu0", "gpu9", LinkKind.PCIE, 1e9)])


def test_duplicate_node():
    with pytest.raises(TopologyError, match="gpu0: defined twice"):
        Topology([Node("gpu0", NodeKind.GPU), Node("gpu0", NodeKind.CPU)], [])


def test_duplicate_link():
    nodes = [Node("gpu0", NodeKind.GPU), Node("gpu1", NodeKind.GPU)]
    links = [Link("gpu0", "gpu1", LinkKind.NVLINK, 1e9), Link("gpu0", "gpu1", LinkKind.NVLINK, 2e9), Link("gpu1", "gpu0", LinkKind.NVLINK, 1e9)]
    with pytest.raises(TopologyError, match="gpu0->gpu1: defined twice"):
        Topology(nodes, links)


def test_duplicate_rank():
    nodes = [Node("gpu0", NodeKind.GPU, rank=0), Node("gpu1", NodeKind.GPU, rank=0)]
    links = [Link("gpu0", "gpu1", LinkKind.NVLINK, 1e9), Link("gpu1", "gpu0", LinkKind.NVLINK, 1e9)]
    with pytest.raises(TopologyError, match="rank 0 already used by node gpu0"):
        Topology(nodes, links)


def test_disconnected_compute_nodes():
    nodes = [Node(f"gpu{i}", NodeKind.GPU) for i in range(3)] + [Node("cpu0", NodeKind.CPU)]
    links = [Link("gpu0", "gpu1", LinkKind.NVLINK, 1e9), Link("gpu1", "gpu0", LinkKind.NVLINK, 1e9)]
    with pytest.raises(TopologyError, match="not connected: gpu2"):
        Topology(nodes, links)


def test_one_way_reachability_is_not_connected():
    nodes = [Node("gpu0", NodeKind.GPU), Node("gpu1", NodeKind.GPU)]
    with pytest.raises(TopologyError, match="not connected"):
        Topology(nodes, [Link("gpu0", "gpu1", LinkKind.NVLINK, 1e9)])


def test_switch_only_islands_are_allowed():
    # a stray switch cut off from the GPUs does not prevent the GPUs from exchanging data
    topo = Topology(list(_pair().nodes) + [Node("pcie_switch0", NodeKind.PCIE_SWITCH)], _pair().links)
    assert topo.compute_nodes() == ("gpu0", "gpu1")


def test_single_compute_node_needs_no_links():
    assert Topology([Node("host0", NodeKind.HOST, rank=0)], []).compute_nodes() == ("host0",)


def test_compute_node_order_ranked_first_then_natural():
    nodes = [
        Node("gpu10", NodeKind.GPU),
        Node("gpu2", NodeKind.GPU),
        Node("gpu1", NodeKind.GPU, rank=1),
        Node("gpu7", NodeKind.GPU, rank=0),
        Node("hub", NodeKind.CPU),
    ]
    builder = TopologyBuilder()
    for node in nodes:
        builder.add_node(node)
    for node in nodes[:-1]:
        builder.add_link(node.id, "hub", LinkKind.PCIE, 1e9)
    assert builder.build().compute_nodes() == ("gpu7", "gpu1", "gpu2", "gpu10")


def test_queries_and_paths():
    b = TopologyBuilder()
    for i in range(3):
        b.add_node(Node(f"gpu{i}", NodeKind.GPU, rank=i))
    b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 50e9, 1e-6)
    b.add_link("gpu1", "gpu2", LinkKind.PCIE, 10e9, 3e-6)
    topo = b.build()
    assert topo.path_bw_bytes_per_s(["gpu0", "gpu1", "gpu2"]) == 10e9
    assert math.isclose(topo.path_latency_s(["gpu0", "gpu1", "gpu2"]), 4e-6)
    assert topo.has_link("gpu1", "gpu0") and not topo.has_link("gpu0", "gpu2")
    with pytest.raises(TopologyError, match="no link gpu0->gpu2"):
        topo.link("gpu0", "gpu2")
    with pytest.raises(TopologyError, match="no node 'gpu9'"):
        topo.node("gpu9")
    assert topo.graph.edges["gpu0", "gpu1"]["record"].kind is LinkKind.NVLINK
    with pytest.raises(Exception):
        topo.graph.add_node("intruder")  # frozen graph


def test_errors_subclass_value_error():
    assert issubclass(TopologyError, ValueError) and issubclass(TopologyError, TopocollError)


def test_natural_key():
    ids = ["gpu10", "gpu2", "n1.gpu0", "gpu1", "n10.gpu0", "n2.gpu11", "n2.gpu3"]
    assert sorted(ids, key=natural_key) == ["gpu1", "gpu2", "gpu10", "n1.gpu0", "n2.gpu3", "n2.gpu11", "n10.gpu0"]


# --------------------------------------------------------------------------- Builder
def test_builder_merges_parallel_links():
    b = TopologyBuilder()
    b.add_node(Node("gpu0", NodeKind.GPU))
    b.add_node(Node("gpu1", NodeKind.GPU))
    b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 25e9, 6e-7)
    b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 25e9, 9e-7)
    topo = b.build()
    for a, c in (("gpu0", "gpu1"), ("gpu1", "gpu0")):
        link = topo.link(a, c)
        assert (link.count, link.bw_bytes_per_s, link.latency_s) == (2, 50e9, 9e-7)


def test_builder_simplex_and_duplicates():
    b = TopologyBuilder()
    b.add_node(Node("gpu0", NodeKind.GPU))
    with pytest.raises(TopologyError, match="defined twice"):
        b.add_node(Node("gpu0", NodeKind.GPU))
    b.add_node(Node("gpu1", NodeKind.GPU))
    b.add_link("gpu0", "gpu1", LinkKind.NVLINK, 1e9, duplex=False)
    with pytest.raises(TopologyError, match="not connected"):
        b.build()
    b.add_link("gpu1", "gpu0", LinkKind.NVLINK, 1e9, duplex=False)
    assert len(b.build().links) == 2
    with pytest.raises(TopologyError, match="bw_bytes_per_s"):
        b.add_link("gpu0", "gpu1", LinkKind.NVLINK, float("nan"))


def test_builder_notes_are_deduplicated():
    b = TopologyBuilder(name="x")
    b.add_node(Node("host0", NodeKind.HOST))
    b.note("speed unknown")
    b.note("speed unknown")
    assert b.build().notes == ("speed unknown",)


# ------------------------------------------------------------------------------ JSON
def test_json_round_trip_is_identical_text():
    text = Topology.from_json_dict(_small_dict()).to_json()
    again = Topology.from_json(text)
    assert again.to_json() == text
    assert again == Topology.from_json(again.to_json())


def test_json_reads_what_the_document_says():
    topo = Topology.from_json(json.dumps(_small_dict()))
    gpu0 = topo.node("gpu0")
    assert (gpu0.rank, gpu0.numa, gpu0.busid, gpu0.name) == (0, 0, "0000:07:00.0", "A100")
    link = topo.link("gpu1", "nvswitch0")
    assert (link.kind, link.bw_bytes_per_s, link.latency_s, link.count) == (LinkKind.NVLINK, 50e9, 6e-7, 2)
    assert topo.name == "two gpus and a switch"


def test_json_keeps_the_optional_gpu_attributes():
    data = _small_dict()
    data["nodes"][0].update(index=3, sm=90, gdr=False)
    topo = Topology.from_json(json.dumps(data))
    gpu0 = topo.node("gpu0")
    assert (gpu0.index, gpu0.sm, gpu0.gdr) == (3, 90, False)
    again = json.loads(topo.to_json())["nodes"]
    assert {k: again[0][k] for k in ("index", "sm", "gdr")} == {"index": 3, "sm": 90, "gdr": False}
    assert not {"index", "sm", "gdr"} & set(again[1])  # absent where unknown, so older files keep their digest


def test_canonical_json_and_digest_do_not_depend_on_input_order():
    data = _small_dict()
    reference = Topology.from_json_dict(data)
    rng = random.Random(7)
    for _ in range(5):
        shuffled = json.loads(json.dumps(data))
        rng.shuffle(shuffled["nodes"])
        rng.shuffle(shuffled["links"])
        other = Topology.from_json_dict(shuffled)
        assert other.to_json() == reference.to_json()
        assert other.digest() == reference.digest()


def test_digest_is_content_hash():
    data = _small_dict()
    base = Topology.from_json_dict(data).digest()
    assert base.startswith("sha256:") and len(base) == len("sha256:") + 64
    renamed = json.loads(json.dumps(data))
    renamed["graph"]["name"] = "another name"
    renamed["graph"]["notes"] = ["a note"]
    assert Topology.from_json_dict(renamed).digest() == base
    faster = json.loads(json.dumps(data))
    for link in faster["links"]:
        link["bw_bytes_per_s"] = 100e9
    assert Topology.from_json_dict(faster).digest() != base
    # stable across processes: the digest is a hash of canonical JSON, recomputed here
    import hashlib

    doc = Topology.from_json_dict(data).to_json_dict()
    body = json.dumps({"nodes": doc["nodes"], "links": doc["links"]}, sort_keys=True, separators=(",", ":"))
    assert base == "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def test_canonical_json_format():
    text = _pair().to_json()
    assert text.endswith("}\n")
    doc = json.loads(text)
    assert doc["directed"] is True and doc["graph"]["format"] == FORMAT
    assert list(doc) == sorted(doc)  # sorted keys


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.__setitem__("nodes", {}), "'nodes' and 'links' must be lists"),
        (lambda d: d.__setitem__("directed", False), "directed"),
        (lambda d: d["nodes"][1].__setitem__("kind", "tpu"), r"nodes\[1\] \(gpu1\): kind 'tpu' is not one of"),
        (lambda d: d["nodes"][1].pop("id"), r"nodes\[1\]: missing 'id'"),
        (lambda d: d["nodes"][1].__setitem__("rank", "1"), r"nodes\[1\] \(gpu1\).*rank"),
        (lambda d: d["nodes"].__setitem__(0, "gpu0"), r"nodes\[0\]: expected an object"),
        (lambda d: d["links"][2].__setitem__("bw_bytes_per_s", "50e9"), r"links\[2\] \(gpu1->nvswitch0\).*bw_bytes_per_s"),
        (lambda d: d["links"][2].__setitem__("bw_bytes_per_s", -5.0), r"links\[2\].*bw_bytes_per_s"),
        (lambda d: d["links"][2].__setitem__("latency_s", -1e-6), r"links\[2\].*latency_s"),
        (lambda d: d["links"][2].pop("target"), r"links\[2\]: missing 'target'"),
        (lambda d: d["links"][2].__setitem__("kind", "infiniband"), r"links\[2\].*kind 'infiniband'"),
        (lambda d: d["links"][2].__setitem__("count", 0), r"links\[2\].*count"),
        (lambda d: d["links"][2].__setitem__("target", "gpu7"), "unknown endpoint 'gpu7'"),
        (lambda d: d["graph"].__setitem__("notes", "x"), "graph.notes"),
        (lambda d: d["graph"].__setitem__("name", 3), "graph.name"),
        (lambda d: d["nodes"][1].__setitem__("rank", 0), "rank 0 already used"),
        (lambda d: d["nodes"].append({"id": "gpu0", "kind": "gpu"}), "gpu0: defined twice"),
    ],
)
def test_json_type_errors_name_source_and_element(mutate, message):
    data = _small_dict()
    mutate(data)
    with pytest.raises(TopologyError, match=message) as info:
        Topology.from_json(json.dumps(data), source="cluster.json")
    assert str(info.value).startswith("cluster.json: ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_json_rejects_non_finite_literals(constant):
    text = json.dumps(_small_dict()).replace("50000000000.0", constant, 1)
    with pytest.raises(TopologyError, match=f"{constant.lstrip('-')}|{constant}"):
        Topology.from_json(text, source="t.json")


def test_malformed_json_names_the_line():
    with pytest.raises(TopologyError, match=r"t.json: line 2: malformed JSON"):
        Topology.from_json('{\n  "nodes": [,\n}', source="t.json")


def test_json_not_an_object():
    with pytest.raises(TopologyError, match="expected a JSON object"):
        Topology.from_json("[1, 2]", source="t.json")


def test_edges_key_is_accepted():
    data = _small_dict()
    data["edges"] = data.pop("links")
    assert Topology.from_json_dict(data).digest() == Topology.from_json_dict(_small_dict()).digest()
