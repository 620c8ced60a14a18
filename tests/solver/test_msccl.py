"""MSCCL XML export: the format's rules checked on the written file, the round trip through the
verifier for every collective, tampered programs refused, and ``topocoll msccl``."""

from __future__ import annotations

import re
from xml.etree import ElementTree

import pytest

from tests.hostile import assert_one_line_error
from tests.solver import helpers as H
from topocoll.cli import main
from topocoll.errors import FormatError, ScheduleError
from topocoll.solver import msccl
from topocoll.solver.planner import plan_collective
from topocoll.solver.schedule import SYNTHESIZED, Collective
from topocoll.solver.traffic import route_fast, candidate_paths, routing_schedule, traffic_matrix
from topocoll.solver.verify import verify
from topocoll.topo.presets import build_preset

STEP_ATTRS = {"s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"}


def _schedule(topology, collective, size=64 << 20):
    ranks = topology.compute_nodes()
    root = 1 if collective.is_rooted else None
    return plan_collective(topology, collective, ranks, root, size).schedule


def _check_format(text: str, n: int, max_steps: int) -> None:
    """The rules of the executors' parsers (module docstring of topocoll.solver.msccl), read off the file."""
    assert not text.startswith("<?xml") and "\t" not in text
    algo = ElementTree.fromstring(text)
    assert algo.tag == "algo" and int(algo.get("ngpus")) == n
    assert {"name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes", "maxBytes"} <= set(algo.attrib)
    chunks = int(algo.get("nchunksperloop"))
    channels = int(algo.get("nchannels"))
    assert 1 <= channels <= 32
    gpus = algo.findall("gpu")
    assert sorted(int(g.get("id")) for g in gpus) == list(range(n))
    for gpu in gpus:
        g = int(gpu.get("id"))
        sizes = {b: int(gpu.get(f"{b}_chunks")) for b in "ios"}
        tbs = gpu.findall("tb")
        assert [int(tb.get("id")) for tb in tbs] == list(range(len(tbs)))  # contiguous from 0
        steps_of = {}
        for tb in tbs:
            send, recv, chan = int(tb.get("send")), int(tb.get("recv")), int(tb.get("chan"))
            assert send != g and recv != g and -1 <= send < n and -1 <= recv < n and 0 <= chan < channels
            steps = tb.findall("step")
            assert len(steps) <= max_steps
            assert [int(st.get("s")) for st in steps] == list(range(len(steps)))
            steps_of[int(tb.get("id"))] = steps
            for st in steps:
                assert set(st.attrib) == STEP_ATTRS
                kind, count = st.get("type"), int(st.get("cnt"))
                assert 0 <= count < 72
                if kind != "nop":
                    buffer = st.get("srcbuf")
                    assert sizes[buffer] == chunks and 0 <= int(st.get("srcoff")) and int(st.get("srcoff")) + count <= chunks
                assert (kind == "s") <= (send >= 0) and (kind in ("r", "rrc")) <= (recv >= 0)
        for tb_steps in steps_of.values():
            for st in tb_steps:
                depid, deps = int(st.get("depid")), int(st.get("deps"))
                if depid >= 0:  # a wait names a step of another block of this GPU, which says others wait for it
                    target = steps_of[depid][deps]
                    assert target.get("hasdep") == "1"


@pytest.mark.parametrize("collective", SYNTHESIZED, ids=lambda c: c.value)
@pytest.mark.parametrize("dialect", sorted(msccl.DIALECTS))
def test_every_collective_round_trips_through_the_verifier(collective, dialect):
    topology = build_preset("dgx1-v100")
    schedule = _schedule(topology, collective)
    program = msccl.to_msccl(schedule, 64, dialect=dialect)
    _check_format(program.text, 8, msccl.DIALECTS[dialect][1])
    coll = ElementTree.fromstring(program.text).get("coll")
    assert coll == {"reduce_scatter": msccl.DIALECTS[dialect][0]}.get(collective.value, collective.value)
    back = msccl.from_msccl(program.text, topology, schedule.ranks, schedule.root)
    assert back.collective is collective and len(back.chunks) == 64
    result = verify(back, topology)
    assert result.ok, result.errors


def test_a_fine_grid_keeps_the_chunks_and_spreads_over_channels():
    topology = H.nvswitch_box(4)
    schedule = _schedule(topology, Collective.ALLGATHER)
    program = msccl.to_msccl(schedule)
    assert program.chunks_per_loop % 4 == 0 and program.elements <= msccl.MAX_ELEMENTS
    assert program.max_shift <= 0.5 / program.chunks_per_loop + 1e-12
    assert verify(msccl.from_msccl(program.text, topology, schedule.ranks), topology).ok


def _steps(text: str):
    algo = ElementTree.fromstring(text)
    return algo, [st for gpu in algo.findall("gpu") for tb in gpu.findall("tb") for st in tb.findall("step")]


def test_a_program_without_its_waits_is_caught():
    """Every send waits for the reduces into its chunk: without the waits a run may go right by
    chance, but nothing orders the blocks, which the replay calls a race."""
    topology = H.nvswitch_box(4)
    schedule = _schedule(topology, Collective.ALLREDUCE)
    program = msccl.to_msccl(schedule, 16)
    algo, steps = _steps(program.text)
    assert any(st.get("depid") != "-1" for st in steps)
    for st in steps:
        st.set("depid", "-1")
        st.set("deps", "-1")
    with pytest.raises(FormatError, match=r"touch chunk \d+ with no wait between them \(a race\)"):
        msccl.from_msccl(ElementTree.tostring(algo, encoding="unicode"), topology, schedule.ranks)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ("swap", "receives"),
        ("drop", "waits for ever"),
        ("type", "step type 'rcs' is not one topocoll replays"),
        ("coll", "collective 'alltoallv' is not one topocoll replays"),
        ("offset", "which topocoll's schedules do not express"),
    ],
)
def test_tampered_programs_are_refused(change, fragment):
    topology = H.nvswitch_box(4)
    schedule = _schedule(topology, Collective.ALLREDUCE)
    algo, _ = _steps(msccl.to_msccl(schedule, 16).text)
    receiving = next(tb for tb in algo.iter("tb") if tb.get("recv") != "-1" and len([s for s in tb if s.get("type") != "nop"]) >= 2)
    real = [s for s in receiving if s.get("type") != "nop"]
    if change == "swap":
        for key in ("srcoff", "dstoff", "cnt"):
            a, b = real[0].get(key), real[1].get(key)
            real[0].set(key, b)
            real[1].set(key, a)
        if real[0].get("srcoff") == real[1].get("srcoff"):
            pytest.skip("two equal receives")
    elif change == "drop":
        receiving.remove(real[-1])
    elif change == "type":
        real[0].set("type", "rcs")
    elif change == "coll":
        algo.set("coll", "alltoallv")
    else:
        real[0].set("dstoff", str(int(real[0].get("srcoff")) + 1))
    with pytest.raises(FormatError, match=re.escape(fragment)):
        msccl.from_msccl(ElementTree.tostring(algo, encoding="unicode"), topology, schedule.ranks)


def test_what_cannot_be_exported_is_refused():
    topology = H.nvswitch_box(4)
    with pytest.raises(ScheduleError, match="multiple of the ranks"):
        msccl.to_msccl(_schedule(topology, Collective.ALLGATHER), 6)
    with pytest.raises(ScheduleError, match="unknown MSCCL dialect"):
        msccl.to_msccl(_schedule(topology, Collective.ALLREDUCE), dialect="nccl")
    ranks = topology.compute_nodes()
    matrix = traffic_matrix("zipf", len(ranks), 1 << 20)
    alltoall = routing_schedule(route_fast(candidate_paths(topology, ranks), matrix), topology, matrix)
    with pytest.raises(ScheduleError, match="MSCCL's alltoall moves equal blocks"):
        msccl.to_msccl(alltoall)


def test_command_writes_a_checked_program(capsys, tmp_path):
    topology_path = tmp_path / "node.json"
    topology_path.write_text(H.nvswitch_box(4).to_json())
    schedule_path, xml_path = tmp_path / "ar.json", tmp_path / "ar.xml"
    assert main(["synthesize", "--topology", str(topology_path), "--collective", "allreduce", "-o", str(schedule_path)]) == 0
    capsys.readouterr()
    assert main(["msccl", str(schedule_path), "--topology", str(topology_path), "--chunks-per-loop", "32", "-o", str(xml_path)]) == 0
    out = capsys.readouterr().out
    assert "32 chunks per loop" in out and re.search(r"^replayed\s+\d+ rounds, verified$", out, re.MULTILINE)
    assert ElementTree.fromstring(xml_path.read_text()).get("nchunksperloop") == "32"
    status = main(["msccl", str(schedule_path), "--topology", str(topology_path), "--chunks-per-loop", "0", "-o", str(tmp_path / "bad.xml")])
    assert_one_line_error(status, capsys.readouterr().err, "topocoll", "chunks per loop must be >= 1")
    assert not (tmp_path / "bad.xml").exists()
