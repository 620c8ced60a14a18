"""Pictures of topologies (PNG, matplotlib's Agg renderer; no display needed).

The layout is layered: network switches on top, then NICs, CPUs, PCIe switches, GPUs (and
CPU-process ranks), NVSwitches at the bottom; machines (``host_id``) side by side, each in its
own column, with its name above it. Node shape and colour give the kind, edge colour the link
technology and edge width the bandwidth (log scale). Links between nodes of one layer (GPU
meshes) are drawn as arcs so that they do not hide each other.

Beyond ``max_expanded_gpus`` GPUs, each machine is drawn as one box and only the network is
shown; the title says so.
"""

from __future__ import annotations

import io
import logging
import math
import os
from collections import defaultdict
from collections.abc import Mapping
from types import MappingProxyType

from topocoll.fileio import write_atomic
from topocoll.topo.model import LinkKind, NodeKind, Topology, natural_key

log = logging.getLogger(__name__)

#: Machines with more GPUs than this in total are drawn collapsed (one box per machine).
DEFAULT_MAX_EXPANDED_GPUS = 64

_LAYER: Mapping[NodeKind, int] = MappingProxyType({
    NodeKind.NET_SWITCH: 1,
    NodeKind.NIC: 2,
    NodeKind.CPU: 3,
    NodeKind.PCIE_SWITCH: 4,
    NodeKind.GPU: 5,
    NodeKind.HOST: 5,
    NodeKind.NVSWITCH: 6,
})
_NODE_STYLE: Mapping[NodeKind, tuple[str, str]] = MappingProxyType({  # (marker, colour)
    NodeKind.GPU: ("s", "#76b900"),
    NodeKind.HOST: ("o", "#9e9e9e"),
    NodeKind.CPU: ("o", "#1f77b4"),
    NodeKind.NVSWITCH: ("h", "#2ca02c"),
    NodeKind.PCIE_SWITCH: ("D", "#17becf"),
    NodeKind.NIC: ("^", "#ff7f0e"),
    NodeKind.NET_SWITCH: ("p", "#d62728"),
})
_EDGE_COLOUR: Mapping[LinkKind, str] = MappingProxyType({
    LinkKind.NVLINK: "#4a8a00",
    LinkKind.PCIE: "#17becf",
    LinkKind.C2C: "#8c564b",
    LinkKind.XGMI: "#e377c2",
    LinkKind.SMP: "#9467bd",
    LinkKind.NET: "#ff7f0e",
    LinkKind.SHM: "#7f7f7f",
    LinkKind.LOOPBACK: "#000000",
})
_COLLAPSED_MARKER = ("s", "#bcbd22")
_UNUSED_COLOUR = "#d9d9d9"


def draw_topology(
    topology: Topology,
    path: str | os.PathLike,
    *,
    title: str | None = None,
    max_expanded_gpus: int = DEFAULT_MAX_EXPANDED_GPUS,
    link_utilisation: Mapping[tuple[str, str], float] | None = None,
) -> None:
    """Draw ``topology`` to a PNG file at ``path`` (written atomically).

    Parameters
    ----------
    topology : Topology
    path : path-like
        Output file.
    title : str, optional
        Figure title (default: the topology's name and node counts).
    max_expanded_gpus : int
        Above this many GPUs, machines (nodes sharing a ``host_id``) are drawn as one box each.
    link_utilisation : mapping of (src, dst) to float, optional
        A load picture: each link's busy fraction (0-1, e.g. from the event simulator). Edges
        are then coloured by the busier of their two directions (unused ones pale grey) and a
        colour bar replaces the technology colours; widths still give the bandwidth.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    import networkx as nx

    gpus = len(topology.nodes_of(NodeKind.GPU))
    hosts = sorted({n.host_id for n in topology.nodes if n.host_id}, key=natural_key)
    collapse = gpus > max_expanded_gpus and len(hosts) > 1
    graph, kinds, edge_kind, edge_bw, group_of = _drawing_graph(topology, collapse)
    edge_use = _edge_utilisation(topology, collapse, link_utilisation) if link_utilisation is not None else None
    pos, groups, width_units = _layout(graph, kinds, group_of)

    many = len(graph) > 120
    fig_w = min(48.0, max(9.0, 1.2 + 0.42 * width_units))
    fig = Figure(figsize=(fig_w, 7.5 if not collapse else 6.0))
    FigureCanvasAgg(fig)
    legend_in = 2.6  # inches kept free on the right for the legend
    ax = fig.add_axes((0.01, 0.02, max(0.6, 1 - legend_in / fig_w), 0.88))
    ax.set_axis_off()

    bws = [b for b in edge_bw.values()]
    low, high = (min(bws), max(bws)) if bws else (1.0, 1.0)

    def width(bw_value: float) -> float:
        if high <= low:
            return 2.0
        return 0.6 + 4.0 * (math.log(bw_value) - math.log(low)) / (math.log(high) - math.log(low))

    alpha = 0.75 if len(edge_bw) <= 300 else max(0.12, 0.75 * 300 / len(edge_bw))
    straight, curved = [], []
    for edge in edge_bw:
        a, b = edge
        (curved if pos[a][1] == pos[b][1] else straight).append(edge)
    load_colours = None
    if edge_use is not None:
        from matplotlib import colormaps
        from matplotlib.colors import Normalize

        load_colours = (colormaps["plasma_r"], Normalize(0.0, 1.0))
        alpha = max(alpha, 0.9)

    def colour(edge, kind):
        if load_colours is None:
            return _EDGE_COLOUR[kind]
        use = edge_use.get(edge, 0.0)
        return _UNUSED_COLOUR if use <= 0 else load_colours[0](load_colours[1](min(use, 1.0)))

    for group, rad in ((straight, None), (curved, 0.35)):
        for kind in LinkKind:
            edges = [e for e in group if edge_kind[e] is kind]
            if not edges:
                continue
            widths = [width(edge_bw[e]) for e in edges]
            colours = [colour(e, kind) for e in edges]
            if rad is None:
                nx.draw_networkx_edges(graph, pos, edgelist=edges, width=widths, edge_color=colours, alpha=alpha, ax=ax, arrows=False)
            else:
                nx.draw_networkx_edges(
                    graph, pos, edgelist=edges, width=widths, edge_color=colours, alpha=alpha, ax=ax,
                    arrows=True, arrowstyle="-", connectionstyle=f"arc3,rad={rad}", node_size=300,
                )
    node_size = 120 if many else 420
    for kind in NodeKind:
        members = [n for n in graph if kinds[n] is kind]
        if not members:
            continue
        marker, colour = _COLLAPSED_MARKER if collapse and kind is NodeKind.HOST else _NODE_STYLE[kind]
        nx.draw_networkx_nodes(graph, pos, nodelist=members, node_shape=marker, node_color=colour, node_size=node_size, edgecolors="black", linewidths=0.6, ax=ax)
    if len(graph) <= 400:
        labels = {n: _short_label(n, group_of.get(n)) for n in graph}
        nx.draw_networkx_labels(graph, pos, labels=labels, font_size=5 if many else 7, ax=ax)
    for name, (x_mid, y_top) in groups.items():
        ax.text(x_mid, y_top, name, ha="center", va="bottom", fontsize=9, fontweight="bold")

    handles = []
    for kind in NodeKind:
        if any(kinds[n] is kind for n in graph):
            marker, colour = _COLLAPSED_MARKER if collapse and kind is NodeKind.HOST else _NODE_STYLE[kind]
            label = "machine (collapsed)" if collapse and kind is NodeKind.HOST else kind.value
            handles.append(Line2D([], [], marker=marker, color="none", markerfacecolor=colour, markeredgecolor="black", markersize=9, label=label))
    for kind in LinkKind:
        values = [edge_bw[e] for e in edge_bw if edge_kind[e] is kind]
        if values:
            lo, hi = min(values) / 1e9, max(values) / 1e9
            text = f"{kind.value} {lo:.3g} GB/s" if lo == hi else f"{kind.value} {lo:.3g}-{hi:.3g} GB/s"
            line_colour = _EDGE_COLOUR[kind] if load_colours is None else "#555555"
            handles.append(Line2D([], [], color=line_colour, linewidth=width(max(values)), label=text))
    if load_colours is not None:
        from matplotlib.cm import ScalarMappable

        bar_ax = fig.add_axes((1 - 2.2 / fig_w, 0.08, 0.12 / fig_w, 0.25))
        bar = fig.colorbar(ScalarMappable(norm=load_colours[1], cmap=load_colours[0]), cax=bar_ax)
        bar.set_label("utilisation (busier direction)", fontsize=7)
        bar.ax.tick_params(labelsize=7)
        handles.append(Line2D([], [], color=_UNUSED_COLOUR, linewidth=2, label="unused"))
    fig.legend(handles=handles, loc="center right", fontsize=8, title="kind / bandwidth (one direction)", title_fontsize=8, frameon=False)

    counts = ", ".join(f"{v} {k}" for k, v in topology.summary_counts().items())
    heading = title or f"{topology.name or 'topology'} ({counts})"
    if collapse:
        heading += f"\n{len(hosts)} machines collapsed to one box each ({gpus} GPUs > {max_expanded_gpus}); network links aggregated"
    elif len(graph) > 400:
        heading += "\nlabels omitted (too many nodes)"
    fig.suptitle(heading, fontsize=10)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    write_atomic(path, buffer.getvalue())
    log.info("drew %d nodes to %s", len(graph), path)


def _edge_utilisation(topology: Topology, collapse: bool, use: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """Per drawn edge, the highest utilisation among the links it stands for."""
    out: dict[tuple[str, str], float] = {}
    for (src, dst), value in use.items():
        a, b = src, dst
        if collapse:
            a = topology.node(src).host_id or src
            b = topology.node(dst).host_id or dst
        if a == b:
            continue
        edge = (a, b) if natural_key(a) <= natural_key(b) else (b, a)
        out[edge] = max(out.get(edge, 0.0), float(value))
    return out


def _drawing_graph(topology: Topology, collapse: bool):
    """Undirected graph to draw, with per-node kind, per-edge kind/bandwidth and host groups."""
    import networkx as nx

    def key(node_id: str) -> str:
        host = topology.node(node_id).host_id
        return host if collapse and host else node_id

    graph = nx.Graph()
    kinds: dict[str, NodeKind] = {}
    group_of: dict[str, str] = {}
    for node in topology.nodes:
        k = key(node.id)
        if k not in graph:
            graph.add_node(k)
            kinds[k] = NodeKind.HOST if collapse and node.host_id else node.kind
        if node.host_id and not collapse:
            group_of[k] = node.host_id
    edge_kind: dict[tuple[str, str], LinkKind] = {}
    edge_bw: dict[tuple[str, str], float] = defaultdict(float)
    for link in topology.links:
        a, b = key(link.src), key(link.dst)
        if a == b:
            continue
        edge = (a, b) if natural_key(a) <= natural_key(b) else (b, a)
        graph.add_edge(*edge)
        edge_kind.setdefault(edge, link.kind)
        # both directions of a duplex link: keep the larger; parallel trunks of a collapsed
        # machine add up (only one direction counted)
        if collapse and (link.src != a or link.dst != b):
            if natural_key(link.src) <= natural_key(link.dst):
                edge_bw[edge] += link.bw_bytes_per_s
        else:
            edge_bw[edge] = max(edge_bw[edge], link.bw_bytes_per_s)
    return graph, kinds, edge_kind, dict(edge_bw), group_of


def _layout(graph, kinds: Mapping[str, NodeKind], group_of: Mapping[str, str]):
    """Positions: one column block per machine, one row per layer; shared switches on top."""
    layer_of = {n: _LAYER[kinds[n]] for n in graph}
    for n in graph:  # spines above leaves
        if kinds[n] is NodeKind.NET_SWITCH and not any(layer_of[m] > 1 for m in graph[n] if kinds[m] is not NodeKind.NET_SWITCH):
            layer_of[n] = 0
    blocks: dict[str | None, list[str]] = defaultdict(list)
    for n in graph:
        blocks[group_of.get(n) if kinds[n] is not NodeKind.NET_SWITCH else "\0net"].append(n)
    machine_blocks = sorted((g for g in blocks if g != "\0net"), key=lambda g: natural_key(g or ""))
    pos: dict[str, tuple[float, float]] = {}
    labels: dict[str, tuple[float, float]] = {}
    x0 = 0.0
    for group in machine_blocks:
        members = blocks[group]
        per_layer: dict[int, list[str]] = defaultdict(list)
        for n in members:
            per_layer[layer_of[n]].append(n)
        block_width = max(len(v) for v in per_layer.values())
        for layer, nodes in per_layer.items():
            nodes.sort(key=natural_key)
            step = block_width / len(nodes)
            for i, n in enumerate(nodes):
                pos[n] = (x0 + step * (i + 0.5), -float(layer))
        if group is not None:
            labels[group] = (x0 + block_width / 2, -min(per_layer) + 0.35)
        x0 += block_width + 1.0
    total = max(x0 - 1.0, 1.0)
    net = blocks.get("\0net", [])
    per_layer = defaultdict(list)
    for n in net:
        per_layer[layer_of[n]].append(n)
    for layer, nodes in per_layer.items():
        nodes.sort(key=natural_key)
        step = total / len(nodes)
        for i, n in enumerate(nodes):
            pos[n] = (step * (i + 0.5), -float(layer) + 0.5)
    width_units = max(total, max((len(v) for v in per_layer.values()), default=0))
    if labels and per_layer:
        labels = {g: (x, y - 0.1) for g, (x, y) in labels.items()}
    return pos, labels, width_units


#: Shorter label prefixes so that labels of neighbouring switches do not overlap.
_LABEL_ABBREVIATIONS = (("pcie_switch", "psw"), ("nvswitch", "nvs"))


def _short_label(node_id: str, group: str | None) -> str:
    if group and node_id.startswith(f"{group}."):
        node_id = node_id[len(group) + 1 :]
    for long, short in _LABEL_ABBREVIATIONS:
        if node_id.startswith(long):
            return short + node_id[len(long) :]
    return node_id
