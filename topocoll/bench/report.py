"""Benchmark and simulation reports: the nccl-tests table, JSON, CSV and a bandwidth plot.

A :class:`Report` holds rows of measured (or predicted) results for one collective, one
:class:`Measurement` per *series* (``topo`` and the baseline for the benchmark; topocoll's
schedule and the baselines for the simulator), plus the cut bound's time per size. The
benchmark measures every series out of place and in place, and its text table starts exactly
as nccl-tests' does (``size count type redop root``, then ``time algbw busbw #wrong`` out of
place and in place for the backend under test, same number formats) so that scripts written
for nccl-tests keep working; the baseline's two groups, the speedup, the bound's algbw and the
percentage of it follow on the same line. Speedup and percentage are those of
torch.distributed's own form of the collective (in place for allreduce, broadcast and reduce,
out of place for allgather and reduce-scatter): the row's ``results``.

Units inside are seconds and bytes per second; the table shows µs and GB/s (1e9 bytes/s) as
nccl-tests does, JSON keeps SI units, CSV names the unit in each column header.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

from topocoll.fileio import write_atomic
from topocoll.solver.metrics import bus_factor
from topocoll.solver.schedule import Collective
from topocoll.units import GB

__all__ = ["FORMAT", "Measurement", "Row", "Report", "format_time_us", "speedup", "percent_of_bound"]

FORMAT = "topocoll.bench/1"
"""``format`` field of the JSON report."""

US_PER_S = 1e6


@dataclass(frozen=True, slots=True)
class Measurement:
    """One operation's time and bandwidths.

    Attributes
    ----------
    time_s : float
        Time of one operation (combined across ranks as ``-a`` says).
    algbw_bytes_per_s, busbw_bytes_per_s : float
        nccl-tests' algorithm and bus bandwidth.
    wrong : int or None
        Elements that differ from the reference, summed over ranks; None when not checked.
    """

    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    wrong: int | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """SI units."""
        return {
            "time_s": self.time_s,
            "algbw_bytes_per_s": self.algbw_bytes_per_s,
            "busbw_bytes_per_s": self.busbw_bytes_per_s,
            "wrong": self.wrong,
        }


@dataclass(frozen=True, slots=True)
class Row:
    """One size of the sweep.

    Attributes
    ----------
    size_bytes, count : int
        nccl-tests' ``size`` (S) and ``count`` columns.
    dtype : str
        nccl-tests' type name.
    redop : str
        Reduction name, ``none`` for collectives that do not reduce.
    root : int
        Root rank, -1 for collectives without one.
    results : tuple of (Measurement or None)
        One per series of the report (None: not available for this size).
    bound_time_s : float or None
        Cut-bound time for S, None when unknown.
    placed : pair of tuples of (Measurement or None), or None
        The benchmark's out-of-place and in-place measurements, one per series each
        (``results`` is one of the two); None for predictions.
    """

    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    results: tuple[Measurement | None, ...]
    bound_time_s: float | None = None
    placed: tuple[tuple[Measurement | None, ...], tuple[Measurement | None, ...]] | None = None

    def groups(self) -> tuple[Measurement | None, ...]:
        """The table's result groups in order: per series, out of place then in place (or
        the one result per series when the row has no placements)."""
        if self.placed is None:
            return self.results
        out_of_place, in_place = self.placed
        return tuple(m for pair in zip(out_of_place, in_place) for m in pair)

    @property
    def bound_algbw_bytes_per_s(self) -> float | None:
        """``S / bound time`` (None when the bound is unknown or zero)."""
        if self.bound_time_s is None or self.bound_time_s <= 0:
            return None
        return self.size_bytes / self.bound_time_s


def speedup(row: Row) -> float | None:
    """Fastest other series' time divided by the first series' time (None if unknown)."""
    first = row.results[0] if row.results else None
    others = [m.time_s for m in row.results[1:] if m is not None and m.time_s > 0]
    if first is None or first.time_s <= 0 or not others:
        return None
    return min(others) / first.time_s


def percent_of_bound(row: Row) -> float | None:
    """The first series' algbw as a percentage of the cut bound's algbw."""
    first = row.results[0] if row.results else None
    bound = row.bound_algbw_bytes_per_s
    if first is None or bound is None:
        return None
    return 100.0 * first.algbw_bytes_per_s / bound


def format_time_us(time_s: float) -> str:
    """nccl-tests' time cell: ``%7.0f`` from 10 ms, ``%7.1f`` from 100 µs, else ``%7.2f`` (µs)."""
    us = time_s * US_PER_S
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


_LEAD_WIDTH = 2 + 10 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6
"""Width of ``#`` plus nccl-tests' size/count/type/redop/root columns."""

_NCCL_TESTS_PLACEMENTS = "           out-of-place                       in-place          "
"""nccl-tests' labels over its two result groups (printed after the leading columns)."""

PLACEMENTS = ("out-of-place", "in-place")


@dataclass(frozen=True, slots=True)
class Report:
    """A full benchmark or simulation report.

    Parameters
    ----------
    kind : str
        ``"bench"`` or ``"simulate"``.
    collective : Collective
    world_size : int
    series : tuple of str
        Label of each series (e.g. ``("topo", "gloo")``).
    rows : tuple of Row
    header : tuple of str
        Comment lines printed above the table, without the leading ``#``.
    config : dict
        The run's settings, JSON-ready (command line, sizes, iterations, topology, ...).
    ranks : tuple of dict
        Per-rank information (host, pid, device, topology node), JSON-ready.
    checked : bool
        Whether results were checked (the ``#wrong`` columns show numbers, else ``N/A``).
    show_wrong : bool
        Whether the table has ``#wrong`` columns at all (False for predictions).
    placements : bool
        Whether each series has an out-of-place and an in-place group (the benchmark's
        tables, whose rows carry ``placed``).
    """

    kind: str
    collective: Collective
    world_size: int
    series: tuple[str, ...]
    rows: tuple[Row, ...]
    header: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    ranks: tuple[dict[str, Any], ...] = ()
    checked: bool = True
    show_wrong: bool = True
    placements: bool = False

    # ------------------------------------------------------------------ summaries
    @property
    def wrong_total(self) -> int:
        """Wrong elements over every row and series."""
        return sum(m.wrong or 0 for row in self.rows for m in row.groups() if m is not None)

    def avg_busbw_bytes_per_s(self, series_index: int = 0) -> float:
        """Mean busbw of one series over the rows, out of place and in place (nccl-tests'
        ``Avg bus bandwidth``)."""
        values = []
        for row in self.rows:
            for group in row.placed if row.placed is not None else (row.results,):
                if group[series_index] is not None:
                    values.append(group[series_index].busbw_bytes_per_s)
        return sum(values) / len(values) if values else 0.0


    @property
    def factor(self) -> float:
        """Bus-bandwidth factor of the collective for this world size."""
        return bus_factor(self.collective, self.world_size)

    # --------------------------------------------------------------------- table
    def _group_width(self) -> int:
        return 32 if self.show_wrong else 24

    def _groups(self, row: Row) -> tuple[Measurement | None, ...]:
        if self.placements and row.placed is None:  # a row without placements: empty in-place cells
            return tuple(m for result in row.results for m in (result, None))
        return row.groups()

    def group_labels(self) -> list[str]:
        """The label over each result group of the table."""
        if not self.placements:
            return list(self.series)
        labels = []
        for index, label in enumerate(self.series):
            labels += list(PLACEMENTS) if index == 0 else [f"{label} {placement}" for placement in PLACEMENTS]
        return labels

    def table_header(self) -> list[str]:
        """The three column-header lines (group names, column names, units)."""
        width = self._group_width()
        labels = self.group_labels()
        if self.placements:  # nccl-tests' own line over the first two groups, then ours
            groups = _NCCL_TESTS_PLACEMENTS + "".join(f"{label:^{width}}" for label in labels[2:])
        else:
            groups = "".join(f"{label:^{width}}" for label in labels)
        extra_label = f"vs {self.series[1]}, bound" if len(self.series) == 2 else "vs best baseline, bound"
        groups += f"{extra_label:^25}"
        names = f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
        units = f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
        for _ in labels:
            if self.show_wrong:
                names += f"  {'time':>7}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}"
                units += f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>5}"
            else:
                names += f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}"
                units += f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}"
        names += f"  {'speedup':>7}  {'bound':>6}  {'%bound':>6}"
        units += f"  {'(x)':>7}  {'(GB/s)':>6}  {'(%)':>6}"
        return [("#" + " " * (_LEAD_WIDTH - 1) + groups).rstrip(), names, units]

    def format_row(self, row: Row) -> str:
        """One table line, nccl-tests' format for the leading columns and each group."""
        line = f"{row.size_bytes:12d}  {row.count:12d}  {row.dtype:>8}  {row.redop:>6}  {row.root:6d}"
        for measurement in self._groups(row):
            if measurement is None:
                cells = f"  {'-':>7}  {'-':>6}  {'-':>6}"
                wrong = f"  {'-':>5}"
            else:
                cells = (
                    f"  {format_time_us(measurement.time_s)}  {measurement.algbw_bytes_per_s / GB:6.2f}"
                    f"  {measurement.busbw_bytes_per_s / GB:6.2f}"
                )
                shown = "N/A" if measurement.wrong is None or not self.checked else str(measurement.wrong)
                wrong = f"  {shown:>5}"
            line += cells + (wrong if self.show_wrong else "")
        ratio, bound, percent = speedup(row), row.bound_algbw_bytes_per_s, percent_of_bound(row)
        line += f"  {ratio:7.2f}" if ratio is not None else f"  {'-':>7}"
        line += f"  {bound / GB:6.2f}" if bound is not None else f"  {'-':>6}"
        line += f"  {percent:6.1f}" if percent is not None else f"  {'-':>6}"
        return line

    def footer(self) -> list[str]:
        """nccl-tests' closing lines, plus the other series' averages."""
        lines = []
        if self.show_wrong:
            wrong = self.wrong_total
            lines.append(f"# Out of bounds values : {wrong} {'FAILED' if wrong else 'OK'}")
        lines.append(f"# Avg bus bandwidth    : {self.avg_busbw_bytes_per_s(0) / GB:g} ")
        for index, label in enumerate(self.series[1:], start=1):
            lines.append(f"# {label} average busbw : {self.avg_busbw_bytes_per_s(index) / GB:g}")
        lines.append("#")
        return lines

    def preamble(self) -> str:
        """The comment header and the column headers (what is printed before the first row)."""
        lines = [f"# {text}" if text else "#" for text in self.header]
        lines.append("#")
        lines += self.table_header()
        return "\n".join(lines) + "\n"

    def to_text(self) -> str:
        """The whole report as nccl-tests-style text."""
        lines = [self.format_row(row) for row in self.rows] + self.footer()
        return self.preamble() + "\n".join(lines) + "\n"

    # ---------------------------------------------------------------------- JSON
    def to_json_dict(self) -> dict[str, Any]:
        """All rows and settings, SI units."""
        rows = []
        for row in self.rows:
            bound_alg = row.bound_algbw_bytes_per_s
            rows.append(
                {
                    "size_bytes": row.size_bytes,
                    "count": row.count,
                    "type": row.dtype,
                    "redop": row.redop,
                    "root": row.root,
                    "results": {
                        label: (m.to_json_dict() if m is not None else None) for label, m in zip(self.series, row.results)
                    },
                    **(
                        {
                            placement.replace("-", "_"): {
                                label: (m.to_json_dict() if m is not None else None) for label, m in zip(self.series, group)
                            }
                            for placement, group in zip(PLACEMENTS, row.placed)
                        }
                        if row.placed is not None
                        else {}
                    ),
                    "bound_time_s": row.bound_time_s,
                    "bound_algbw_bytes_per_s": bound_alg,
                    "bound_busbw_bytes_per_s": bound_alg * self.factor if bound_alg is not None else None,
                    "speedup": speedup(row),
                    "percent_of_bound": percent_of_bound(row),
                }
            )
        return {
            "format": FORMAT,
            "kind": self.kind,
            "collective": self.collective.value,
            "world_size": self.world_size,
            "bus_factor": self.factor,
            "series": list(self.series),
            "config": self.config,
            "ranks": list(self.ranks),
            "rows": rows,
            "summary": {
                "wrong": self.wrong_total if self.show_wrong else None,
                "avg_busbw_bytes_per_s": {label: self.avg_busbw_bytes_per_s(i) for i, label in enumerate(self.series)},
            },
        }

    def to_json(self) -> str:
        """Canonical JSON text (sorted keys, two-space indent)."""
        return json.dumps(self.to_json_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"

    # ----------------------------------------------------------------------- CSV
    def to_csv(self) -> str:
        """One line per size; each column header names its unit."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        head = ["size_bytes", "count", "type", "redop", "root"]
        prefixes = [
            f"{label}_{placement.replace('-', '_')}_" if self.placements else f"{label}_"
            for label in self.series
            for placement in (PLACEMENTS if self.placements else ("",))
        ]
        for prefix in prefixes:
            head += [f"{prefix}time_us", f"{prefix}algbw_GB_per_s", f"{prefix}busbw_GB_per_s"]
            if self.show_wrong:
                head.append(f"{prefix}wrong")
        head += ["speedup", "bound_algbw_GB_per_s", "percent_of_bound"]
        writer.writerow(head)
        for row in self.rows:
            cells: list[Any] = [row.size_bytes, row.count, row.dtype, row.redop, row.root]
            for m in self._groups(row):
                if m is None:
                    cells += ["", "", ""] + ([""] if self.show_wrong else [])
                    continue
                cells += [_num(m.time_s * US_PER_S), _num(m.algbw_bytes_per_s / GB), _num(m.busbw_bytes_per_s / GB)]
                if self.show_wrong:
                    cells.append("" if m.wrong is None else m.wrong)
            bound = row.bound_algbw_bytes_per_s
            cells += [_opt(speedup(row)), _opt(bound / GB if bound is not None else None), _opt(percent_of_bound(row))]
            writer.writerow(cells)
        return out.getvalue()

    # ---------------------------------------------------------------------- plot
    def plot_png(self) -> bytes:
        """busbw against size (log scale) for every series and the cut bound, as PNG bytes.

        Raises
        ------
        ImportError
            matplotlib is not installed (``pip install topocoll[plot]``).
        """
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter

        from topocoll.units import size_label

        figure = Figure(figsize=(9, 5.5), dpi=120)
        axes = figure.add_subplot()
        styles = ("o-", "s--", "^-.", "v:", "d-")
        baseline = self.config.get("baseline")
        # one line per series: of several types and ops (-d all, -o all), the first one's rows
        rows = [r for r in self.rows if (r.dtype, r.redop) == (self.rows[0].dtype, self.rows[0].redop)] if self.rows else []
        for index, label in enumerate(self.series):
            points = [
                (r.size_bytes, r.results[index].busbw_bytes_per_s / GB)
                for r in rows
                if r.results[index] is not None and r.results[index].busbw_bytes_per_s > 0
            ]
            if points:
                xs, ys = zip(*points)
                name = f"baseline ({baseline})" if label == "baseline" and baseline else label
                axes.plot(xs, ys, styles[index % len(styles)], label=name, linewidth=1.6, markersize=4)
        bound = [(r.size_bytes, r.bound_algbw_bytes_per_s * self.factor / GB) for r in rows if r.bound_algbw_bytes_per_s]
        if bound:
            xs, ys = zip(*bound)
            axes.plot(xs, ys, color="black", linestyle=(0, (6, 3)), linewidth=1.2, label="cut bound")
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: size_label(int(round(x)))))
        axes.set_xlabel("message size S (bytes)")
        axes.set_ylabel("bus bandwidth (GB/s)")
        model = {"events": "event simulator", "alpha-beta": "α-β model"}.get(self.config.get("model"), "α-β model")
        what = "measured" if self.kind == "bench" else f"predicted ({model})"
        topology = self.config.get("topology", {}).get("name") or "topology"
        which = f" ({rows[0].dtype} {rows[0].redop})" if rows and len(rows) < len(self.rows) else ""
        axes.set_title(f"{self.collective.value}{which}, {self.world_size} ranks on {topology}: {what} busbw")
        # busbw spans orders of magnitude between small and large messages, and the bound can be
        # far above what a loopback run reaches: a log axis keeps every curve readable.
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:g}"))
        axes.grid(True, which="major", alpha=0.35)
        if axes.get_legend_handles_labels()[0]:  # nothing to plot when every busbw is 0 (one rank)
            axes.legend(loc="best")
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()

    # --------------------------------------------------------------------- files
    def write_outputs(self, json_path: str | None = None, csv_path: str | None = None, plot_path: str | None = None) -> None:
        """Write the requested files, each atomically (render everything first, then write)."""
        payloads: list[tuple[str, str | bytes]] = []
        if json_path:
            payloads.append((json_path, self.to_json()))
        if csv_path:
            payloads.append((csv_path, self.to_csv()))
        if plot_path:
            payloads.append((plot_path, self.plot_png()))
        for path, data in payloads:
            write_atomic(path, data)


def _num(value: float) -> str:
    return f"{value:.6g}"


def _opt(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else _num(value)
