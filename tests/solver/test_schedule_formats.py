"""The two schedule file formats: ``topocoll.schedule/1`` spells out every transfer, the compact
``topocoll.schedule/2`` writes each path once and transfers as path numbers grouped by chunk.

Both must read back to the same :class:`Schedule` (transfer order included), the compact form
must hold exactly one path number per transfer and each distinct path once, and a malformed
compact file must be refused in one line naming the element.
"""

from __future__ import annotations

import json

import pytest

from tests.hostile import assert_one_line_error
from tests.solver.helpers import nvswitch_box
from topocoll.cli import main
from topocoll.errors import ScheduleError
from topocoll.solver import plan
from topocoll.solver.baselines import ring
from topocoll.solver.schedule import FORMAT, FORMAT_COMPACT, Collective, Op, Schedule, Transfer, load_schedule
from topocoll.solver.synthesize import synthesize
from topocoll.solver.traffic import route_lp, routing_schedule, traffic_matrix
from topocoll.solver.verify import verify
from topocoll.topo.cluster import make_cluster
from topocoll.topo.presets import build_preset


def _schedules() -> dict[str, Schedule]:
    """Schedules of every shape: LP trees across machines, a ring, a rooted one, an all-to-all."""
    two_machines = make_cluster("dgx-h100", 2)
    dgx1 = build_preset("dgx1-v100")
    box = nvswitch_box(4)
    ranks = box.compute_nodes()
    matrix = traffic_matrix("zipf", len(ranks), 1 << 20, zipf_s=1.2, seed=1)
    return {
        "lp-allreduce-2-machines": plan(two_machines, "allreduce"),
        "lp-allgather-dgx1": plan(dgx1, "allgather"),
        "ring-reduce-scatter": ring(box, Collective.REDUCE_SCATTER, ranks),
        "broadcast-root-2": plan(dgx1, "broadcast", root=2),
        "alltoall": routing_schedule(route_lp(box, ranks, matrix), box, matrix),
    }


SCHEDULES = _schedules()


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_both_formats_read_back_to_the_same_schedule(name):
    schedule = SCHEDULES[name]
    for version, fmt in ((1, FORMAT), (2, FORMAT_COMPACT)):
        text = schedule.to_json(version)
        assert json.loads(text)["format"] == fmt
        assert Schedule.from_json(text, f"{name}.json") == schedule


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_compact_form_names_each_path_once_and_each_transfer_by_one_number(name):
    schedule = SCHEDULES[name]
    data = schedule.to_json_dict(2)
    distinct = {t.path for step in schedule.steps for t in step}
    assert len(data["paths"]) == len(distinct)
    numbers = [p for step in data["steps"] for run in step for group in run["chunks"] for p in group[1:]]
    assert len(numbers) == schedule.transfer_count()
    names = list(schedule.ranks) + data["nodes"]
    assert {tuple(names[v] for v in path) for path in data["paths"]} == distinct


def test_a_compact_file_of_a_large_cluster_is_a_fraction_of_the_long_one():
    cluster = make_cluster("dgx-h100", 8)  # 64 GPUs, packed machine by machine
    schedule = synthesize(cluster, Collective.ALLREDUCE, cluster.compute_nodes()).schedule
    long_bytes, compact_bytes = len(schedule.to_json(1)), len(schedule.to_json(2))
    # a record per transfer is ~100 bytes, a path number ~5: the compact form is well under a fifth
    assert compact_bytes < long_bytes / 5, (compact_bytes, long_bytes)


def test_a_hand_written_compact_schedule_means_what_it_says():
    # two ranks behind one switch: rank 0 reduces chunk 0 into rank 1, rank 1 copies it back
    text = json.dumps(
        {
            "format": FORMAT_COMPACT,
            "collective": "allreduce",
            "name": "by-hand",
            "ranks": ["gpu0", "gpu1"],
            "root": None,
            "topology_digest": "",
            "nodes": ["nvswitch0"],
            "paths": [[0, 2, 1], [1, 2, 0]],
            "chunks": [[7, 0.0, 1.0]],
            "steps": [[{"op": "reduce", "chunks": [[7, 0]]}], [{"op": "copy", "chunks": [[7, 1]]}]],
        }
    )
    schedule = Schedule.from_json(text)
    assert schedule.steps == (
        (Transfer(0, 1, 7, Op.REDUCE, ("gpu0", "nvswitch0", "gpu1")),),
        (Transfer(1, 0, 7, Op.COPY, ("gpu1", "nvswitch0", "gpu0")),),
    )
    assert verify(schedule, nvswitch_box(2)).ok


def _compact(**changes) -> str:
    data = {
        "format": FORMAT_COMPACT,
        "collective": "allgather",
        "name": "",
        "ranks": ["gpu0", "gpu1"],
        "root": None,
        "topology_digest": "",
        "nodes": ["nvswitch0"],
        "paths": [[0, 2, 1], [1, 2, 0]],
        "chunks": [[0, 0.0, 0.5], [1, 0.5, 0.5]],
        "steps": [[{"op": "copy", "chunks": [[0, 0], [1, 1]]}]],
    }
    data.update(changes)
    return json.dumps(data)


def test_the_well_formed_base_of_the_bad_cases_reads():
    assert verify(Schedule.from_json(_compact()), nvswitch_box(2)).ok


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"paths": [[0, 2, 1], [1, 2, 9]]}, "paths[1] must list at least two node numbers in 0..2"),
        ({"paths": [[0, 2, 1], [1, 2]]}, "paths[1] must run between two different ranks (node numbers below 2)"),
        ({"paths": [[0, 2, 0], [1, 2, 0]]}, "paths[0] must run between two different ranks"),
        ({"paths": [[0, 2, 1], [1]]}, "paths[1] must list at least two node numbers"),
        ({"paths": [[0, "x", 1], [1, 2, 0]]}, "paths[0][1] must be an integer, got 'x'"),
        ({"nodes": ["gpu1"]}, "nodes must be distinct and differ from the ranks' nodes"),
        ({"steps": [[{"op": "move", "chunks": [[0, 0]]}]]}, "steps[0][0].op must be 'copy' or 'reduce', got 'move'"),
        ({"steps": [[{"op": "copy", "chunks": [[0]]}]]}, "steps[0][0].chunks[0] must be [chunk id, path number, ...]"),
        ({"steps": [[{"op": "copy", "chunks": [[0, 0], [1, 2]]}]]}, "steps[0][0].chunks[1][1] must be a path number in 0..1, got 2"),
        ({"steps": [[{"op": "copy", "chunks": [[0, True]]}]]}, "steps[0][0].chunks[0][1] must be a path number in 0..1, got True"),
        ({"steps": [[{"op": "copy", "chunks": [[0, -1]]}]]}, "steps[0][0].chunks[0][1] must be a path number in 0..1, got -1"),
        ({"steps": [["copy"]]}, "steps[0][0] must be an object"),
        ({"steps": [[{"op": "copy", "chunks": [[5, 0]]}]]}, "step 0: transfer 0->1 names unknown chunk 5"),
        ({"chunks": [[0, 0.0]]}, "chunks[0] must be [id, offset, size] or [id, offset, size, src, dst]"),
        ({"chunks": [[0, 0.0, 0.5], [1, 0.5, "half"]]}, "chunks[1][2] must be a finite number, got 'half'"),
    ],
)
def test_a_malformed_compact_schedule_is_refused_naming_the_element(changes, message):
    with pytest.raises(ScheduleError) as info:
        Schedule.from_json(_compact(**changes), "s.json")
    assert str(info.value).startswith("s.json: ") and message in str(info.value), str(info.value)


def test_a_compact_schedule_missing_its_path_table_names_the_field():
    data = json.loads(_compact())
    del data["paths"]
    with pytest.raises(ScheduleError, match=r"^s\.json: missing field 'paths'$"):
        Schedule.from_json(json.dumps(data), "s.json")


def test_a_format_from_the_future_is_refused_with_the_formats_this_reader_knows():
    text = _compact(format="topocoll.schedule/4")
    with pytest.raises(ScheduleError) as info:
        Schedule.from_json(text, "s.json")
    assert str(info.value) == (
        "s.json: format must be 'topocoll.schedule/1' or 'topocoll.schedule/2' or 'topocoll.schedule/3', "
        "got 'topocoll.schedule/4' (written by a newer topocoll?)"
    )


def test_a_compact_body_labelled_format_3_is_refused_as_a_schedule_by_rule():
    with pytest.raises(ScheduleError, match=r"^s\.json: not a valid topocoll\.schedule/3 schedule \(KeyError"):
        Schedule.from_json(_compact(format="topocoll.schedule/3"), "s.json")


def test_writing_an_unknown_format_version_is_refused():
    with pytest.raises(ScheduleError, match="format version must be one of"):
        SCHEDULES["ring-reduce-scatter"].to_json(3)


def test_synthesize_writes_the_compact_form_on_request_and_verify_reads_both(capsys, tmp_path):
    topology_path = tmp_path / "dgx1.json"
    topology_path.write_text(build_preset("dgx1-v100").to_json())
    written = {}
    for version in (1, 2):
        path = tmp_path / f"ar{version}.json"
        extra = [] if version == 1 else ["--format", "2"]
        assert main(["synthesize", "--topology", str(topology_path), "--collective", "allreduce", "-o", str(path), *extra]) == 0
        out = capsys.readouterr().out
        fmt = FORMAT if version == 1 else FORMAT_COMPACT
        assert f"wrote       {path} ({fmt}, {path.stat().st_size / 1e6:.1f} MB)" in out
        assert json.loads(path.read_text())["format"] == fmt
        assert main(["verify", str(path), "--topology", str(topology_path)]) == 0
        assert "correct     yes" in capsys.readouterr().out
        written[version] = load_schedule(path)
    assert written[1] == written[2]


def test_verify_finds_a_tampered_compact_schedule_wrong(capsys, tmp_path):
    topology_path = tmp_path / "dgx1.json"
    topology_path.write_text(build_preset("dgx1-v100").to_json())
    path = tmp_path / "ar.json"
    assert main(["synthesize", "--topology", str(topology_path), "--collective", "allreduce", "-o", str(path), "--format", "2"]) == 0
    data = json.loads(path.read_text())
    run = next(run for step in data["steps"] for run in step if run["op"] == "reduce")
    run["op"] = "copy"  # a reduction that overwrites: contributions get lost
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["verify", str(path), "--topology", str(topology_path)]) == 1
    assert "correct     NO:" in capsys.readouterr().out


def test_synthesize_refuses_an_unknown_format(capsys, tmp_path):
    topology_path = tmp_path / "dgx1.json"
    topology_path.write_text(build_preset("dgx1-v100").to_json())
    with pytest.raises(SystemExit) as info:
        main(["synthesize", "--topology", str(topology_path), "--collective", "allreduce", "-o", str(tmp_path / "x.json"), "--format", "4"])
    assert info.value.code == 2
    assert "invalid choice: 4" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_reading_pauses_the_cycle_collector_and_restores_it(monkeypatch):
    import gc

    seen = []
    real_make = Schedule._from_json_dict.__func__

    def spy(cls, data, source):
        seen.append(gc.isenabled())
        return real_make(cls, data, source)

    monkeypatch.setattr(Schedule, "_from_json_dict", classmethod(spy))
    text = SCHEDULES["ring-reduce-scatter"].to_json(2)
    assert gc.isenabled()
    Schedule.from_json(text)
    gc.disable()
    try:
        Schedule.from_json(text)
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
    assert seen == [False, False] and gc.isenabled()


def test_synthesize_suggests_the_compact_form_for_a_large_file(capsys, tmp_path, monkeypatch):
    from topocoll.solver import cli

    topology_path = tmp_path / "dgx1.json"
    topology_path.write_text(build_preset("dgx1-v100").to_json())
    hint = "--format 2 writes the same schedule in a tenth of the size or less"
    for version, limit, shown in ((1, 10**9, False), (1, 1000, True), (2, 1000, False)):
        monkeypatch.setattr(cli, "COMPACT_HINT_BYTES", limit)
        path = tmp_path / f"ar{version}-{limit}.json"
        argv = ["synthesize", "--topology", str(topology_path), "--collective", "allgather", "-o", str(path), "--format", str(version)]
        assert main(argv) == 0
        assert (hint in capsys.readouterr().out) is shown, (version, limit)
