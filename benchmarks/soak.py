"""Soak test of the "topo" backend: thousands of random collectives, each checked against gloo.

Starts ``--ranks`` spawned processes (FileStore rendezvous on a fresh temporary file, the
process-group timeout passed explicitly). Every rank joins three groups over the same ranks: a
gloo world group that computes the expected results (the *reference*), the group under test
(the *subject*: a "topo" group, or with ``--backend gloo`` a second gloo group, which checks the
soak itself) and a gloo group that only carries one flag per collective (the *control* group:
it lets every rank stop together after an exception).

Then it runs ``--collectives`` random collectives. Case ``i`` is drawn from a generator seeded
with ``(seed, i)`` alone, identical on every rank and independent of the cases before it (so
``--start i --collectives 1`` reruns case ``i`` by itself with the same other options): its
kind, dtype, reduce op, root, element counts (0, 1, small odd counts and log-uniform sizes up to
``--max-bytes``), the layout of its tensors (contiguous, strided with gaps, transposed,
offset into a larger buffer) and whether it is issued with ``async_op=True`` (then waited on).
Each rank's data comes from a torch generator seeded with ``(seed, i, rank)``.

Results are compared bit-exactly (``torch.equal``), so the data keeps every result exact:
sums over values in [-k, k] with k * ranks inside the range of the dtype (and inside the
integers a floating-point type holds exactly), products over {-1, 0, 1, 2} or, where 2**ranks
would not fit, {-1, 0, 1}; copies, MIN/MAX and bitwise ops use random bit patterns over the
whole range (random normal values for floating point). Besides the values every check also
catches a write outside a tensor's view (the gaps of a strided layout, the buffer around an
offset one) and a change to the input of an out-of-place collective. The reference never sees
the awkward cases: it gets contiguous copies, int16 goes through int32 (gloo has no int16; the
results are the same for these values) and AVG is a sum divided afterwards (gloo has no AVG).
It uses the plainest gloo calls: ``all_reduce_coalesced`` is checked against one ``all_reduce``
per tensor, ``all_gather_coalesced`` (torch's layout, ``output_tensor_lists[rank][i]``) against
one ``all_gather`` per tensor, the tensor forms against the list forms.

An exception in a collective is recorded with its rank and case; the flag on the control group
then stops every rank after that case. A rank stuck in a collective its peers left returns
within the group timeout (``--timeout-s``), and the launcher kills ranks that make no progress
for twice that long (recorded as errors too). ``--max-errors`` lets the soak go on past
collectives that raised on every rank (an argument error the backend agreed on leaves the group
usable); an exception on only some of the ranks always stops it.

Only the launcher prints: a table per kind (count, wrong, errors, and seconds in the subject,
in the reference and in whole cases, summed over the collectives, the slowest rank's), the
first wrong cases and errors, and the slowest cases. The JSON (``-o``) holds the same figures,
the index of every wrong case and error with the details of the first ones of each kind, the
seed, the options, the torch version and the core count. The exit status is 1 when any result
was wrong or any error happened, 0 otherwise. A rank that completed its report and then failed
while shutting down (now and then one aborts there, from a C++ destructor) is noted and listed
under ``teardown_failures`` in the JSON, without counting as an error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if __name__ in ("__main__", "__mp_main__") and str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run the topocoll of this checkout, not an installed one

FORMAT = "topocoll-soak/1"

KINDS = (
    "all_reduce",
    "all_reduce_coalesced",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
)
REDUCING_KINDS = frozenset({"all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor"})
ROOTED_KINDS = frozenset({"broadcast", "reduce"})
COALESCED_KINDS = frozenset({"all_reduce_coalesced", "all_gather_coalesced"})
GATHERING_KINDS = frozenset({"all_gather", "all_gather_into_tensor", "all_gather_coalesced"})
SCATTERING_KINDS = frozenset({"reduce_scatter", "reduce_scatter_tensor"})

INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "bool")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
DTYPES = INTEGER_DTYPES + FLOAT_DTYPES

ITEMSIZE = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "bool": 1,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
}
EXACT_LIMIT = {
    "int8": 2**7 - 1,
    "int16": 2**15 - 1,
    "int32": 2**31 - 1,
    "int64": 2**63 - 1,
    "uint8": 2**8 - 1,
    "bool": 1,
    "float16": 2**11,
    "bfloat16": 2**8,
    "float32": 2**24,
    "float64": 2**53,
}
"""Largest magnitude every partial sum or product may reach and stay exact in the dtype."""

BITWISE_OPS = ("BAND", "BOR", "BXOR")
ARITHMETIC_OPS = ("SUM", "PRODUCT", "MIN", "MAX")
LAYOUTS = ("contiguous", "strided", "transposed", "offset")
MAX_COALESCED = 4
SAME_SIZE_FRACTION = 0.3
"""Share of coalesced calls whose tensors all have one size (as buckets of one shape often do)."""
MAX_DETAILED_PER_KIND = 40
"""Wrong cases and errors described per kind and rank (their indices are always all kept)."""


# ---------------------------------------------------------------------------- the random cases
@dataclass(frozen=True, slots=True)
class Case:
    """One collective of the soak, the same on every rank.

    ``numels`` holds one count per tensor: the in-place tensor, each tensor of a coalesced call,
    a rank's input of an all-gather, a rank's output shard of a reduce-scatter. ``stacked``
    picks the stacked shape ``(ranks, *shape)`` of a tensor form's large tensor over the
    concatenated one.
    """

    index: int
    kind: str
    dtype: str
    numels: tuple[int, ...]
    op: str | None
    root: int | None
    layout: str
    async_op: bool
    stacked: bool

    def describe(self) -> str:
        parts = [f"#{self.index} {self.kind} {self.dtype} numel={'/'.join(map(str, self.numels))}"]
        if self.op is not None:
            parts.append(self.op)
        if self.root is not None:
            parts.append(f"root={self.root}")
        parts.append(self.layout)
        if self.stacked:
            parts.append("stacked")
        if self.async_op:
            parts.append("async")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Mix:
    """What the cases are drawn from (the same on every rank)."""

    kinds: tuple[str, ...]
    dtypes: tuple[str, ...]
    ranks: int
    max_bytes: int
    irregular_fraction: float
    async_fraction: float

    def __post_init__(self) -> None:
        if not self.kinds:
            raise ValueError("no kinds of collective to draw from")
        if not self.dtypes:
            raise ValueError("no dtypes to draw from")
        if self.ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {self.ranks}")
        if self.max_bytes < 8 * self.ranks * MAX_COALESCED:
            raise ValueError(
                f"max_bytes must be >= {8 * self.ranks * MAX_COALESCED} for {self.ranks} ranks, got {self.max_bytes}"
            )
        for name in ("irregular_fraction", "async_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value}")


def ops_for(dtype: str) -> tuple[str, ...]:
    """Reduce ops valid for a dtype (bitwise ones need integers or bool; AVG needs floating point)."""
    if dtype in FLOAT_DTYPES:
        return ARITHMETIC_OPS + ("AVG",)
    return ARITHMETIC_OPS + BITWISE_OPS


def draw_case(seed: int, index: int, mix: Mix) -> Case:
    """Case ``index`` of the soak with this seed (depends on nothing else)."""
    rng = random.Random(f"topocoll-soak/{seed}/{index}")
    kind = rng.choice(mix.kinds)
    dtype = rng.choice(mix.dtypes)
    op = rng.choice(ops_for(dtype)) if kind in REDUCING_KINDS else None
    root = rng.randrange(mix.ranks) if kind in ROOTED_KINDS else None
    count = rng.randint(1, MAX_COALESCED) if kind in COALESCED_KINDS else 1
    budget = mix.max_bytes // count
    if kind in GATHERING_KINDS or kind in SCATTERING_KINDS:
        budget //= mix.ranks  # the large tensor holds one piece per rank
    numels = tuple(_draw_numel(rng, ITEMSIZE[dtype], budget) for _ in range(count))
    if count > 1 and rng.random() < SAME_SIZE_FRACTION:
        numels = (numels[0],) * count
    layout = "contiguous"
    if rng.random() < mix.irregular_fraction:
        layout = rng.choice(LAYOUTS[1:])
    async_op = rng.random() < mix.async_fraction
    stacked = kind in ("all_gather_into_tensor", "reduce_scatter_tensor") and rng.random() < 0.5
    return Case(index, kind, dtype, numels, op, root, layout, async_op, stacked)


def _draw_numel(rng: random.Random, itemsize: int, budget_bytes: int) -> int:
    most = max(1, budget_bytes // itemsize)
    u = rng.random()
    if u < 0.08:
        return 0
    if u < 0.16:
        return 1
    if u < 0.30:
        return min(most, rng.randrange(3, 64, 2))  # small odd counts
    numel = max(1, int(math.exp(rng.uniform(0.0, math.log(budget_bytes)))) // itemsize)
    if rng.random() < 0.5:
        numel |= 1  # odd counts leave remainders in every split
    return min(numel, most)


# ---------------------------------------------------------------------------- data
def make_values(torch: Any, gen: Any, dtype_name: str, numel: int, op: str | None, ranks: int) -> Any:
    """``numel`` values for one rank whose reduction over ``ranks`` ranks is exact (see the module doc)."""
    dtype = getattr(torch, dtype_name)
    if dtype_name == "bool":
        return torch.randint(0, 2, (numel,), generator=gen).bool()
    floating = dtype_name in FLOAT_DTYPES
    limit = EXACT_LIMIT[dtype_name]
    unsigned = dtype_name == "uint8"
    if op in ("SUM", "AVG"):
        k = max(1, min(3, limit // ranks))
        low = 0 if unsigned else -k
        return torch.randint(low, k + 1, (numel,), generator=gen).to(dtype)
    if op == "PRODUCT":
        high = 3 if 2**ranks <= limit else 2  # {.., 2} while 2**ranks fits
        low = 0 if unsigned else -1
        return torch.randint(low, high, (numel,), generator=gen).to(dtype)
    if floating:
        return torch.randn(numel, generator=gen, dtype=torch.float64).to(dtype)
    raw = torch.randint(0, 256, (numel * ITEMSIZE[dtype_name],), generator=gen, dtype=torch.uint8)
    return raw.view(dtype)  # every bit pattern of the type


@dataclass(slots=True)
class Placed:
    """A tensor in a chosen layout: ``view`` lies inside ``base`` (1-d, contiguous), which held
    ``before`` when the collective started."""

    view: Any
    base: Any
    before: Any

    def expected_base(self, expected: Any) -> Any:
        """``base`` as it should be when ``view`` holds ``expected`` and nothing else changed."""
        want = self.before.clone()
        v = self.view
        want.as_strided(v.size(), v.stride(), v.storage_offset() - self.base.storage_offset()).copy_(expected)
        return want


def unit_shape(numel: int, layout: str) -> tuple[int, ...]:
    """Shape of a case's tensors of ``numel`` elements: 2-d (a, b), a, b >= 2, when transposed."""
    if layout == "transposed":
        a = next((d for d in range(2, math.isqrt(numel) + 1) if numel % d == 0), None)
        if a is not None:
            return (a, numel // a)
    return (numel,)


def place(torch: Any, gen: Any, values: Any, layout: str, shape: tuple[int, ...]) -> Placed:
    """A tensor of ``shape`` holding ``values`` (1-d) in this layout.

    contiguous: a fresh tensor; strided: every second element of a buffer twice as long;
    offset: a contiguous stretch inside a longer buffer; transposed: the dimensions of a
    contiguous buffer in reverse order (strided instead when ``shape`` has one dimension).
    The elements beside the view hold random values, so that writing them shows.
    """
    numel = values.numel()
    if layout == "transposed" and len(shape) < 2:
        layout = "strided"
    if layout == "contiguous":
        base = values.clone()
        return Placed(base.view(shape), base, base.clone())
    if layout == "transposed":
        base = values.clone()
        view = base.view(shape[::-1]).permute(*reversed(range(len(shape))))
        return Placed(view, base, base.clone())
    filler = make_values(torch, gen, _name(values.dtype), 2 * numel + 2, None, 1)
    if layout == "strided":
        base = filler[: 2 * numel].clone()
        view = base[::2].view(shape)
    else:  # offset
        base = filler[: numel + 2].clone()
        view = base[1 : numel + 1].view(shape)
    view.copy_(values.view(shape))
    return Placed(view, base, base.clone())


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def mismatch(got: Any, expected: Any, what: str) -> str | None:
    """None when ``got`` equals ``expected`` bit for bit, else a description of the first difference."""
    if tuple(got.shape) != tuple(expected.shape) or got.dtype != expected.dtype:
        return f"{what}: got {got.dtype} {tuple(got.shape)}, expected {expected.dtype} {tuple(expected.shape)}"
    if got.numel() == 0 or _equal(got, expected):
        return None
    g, e = got.reshape(-1), expected.reshape(-1)
    differs = (g != e).nonzero().reshape(-1)
    if differs.numel() == 0:  # equal values, other bits (e.g. -0.0 and 0.0)
        return f"{what}: same values, different bits"
    first = int(differs[0])
    return (
        f"{what}: {differs.numel()} of {g.numel()} elements differ, first at {first}: "
        f"got {g[first].item()!r}, expected {e[first].item()!r}"
    )


def _equal(a: Any, b: Any) -> bool:
    import torch

    if a.dtype.is_floating_point:  # bit-exact, also for -0.0 and NaN
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(width), b.contiguous().view(width))
    return torch.equal(a, b)


def check_placed(placed: Placed, expected: Any, what: str) -> str | None:
    """Check an output or in-place tensor: its values, and nothing written beside its view."""
    found = mismatch(placed.view, expected, what)
    if found is None and not _equal(placed.base, placed.expected_base(expected)):
        found = f"{what}: wrote outside the tensor's view"
    return found


def check_unchanged(placed: Placed, what: str) -> str | None:
    if not _equal(placed.base, placed.before):
        return f"{what}: the input was changed"
    return None


# ---------------------------------------------------------------------------- calling gloo and the subject
class Calls:
    """torch.distributed collectives on one group, called as given (the backend under test)."""

    def __init__(self, dist: Any, group: Any) -> None:
        self.dist = dist
        self.group = group

    def stage(self, t: Any) -> Any:
        """The tensor to hand to the backend in place of ``t``."""
        return t

    def restore(self, staged: Any, t: Any) -> None:
        """Copy a staged result back into ``t``."""

    def flatten(self, large: Any) -> Any:
        """A (staged) tensor of a tensor form as handed to the backend."""
        return large

    def _op(self, op: str) -> Any:
        return getattr(self.dist.ReduceOp, op)

    def _finish(self, work: Any) -> None:
        if work is not None:
            work.wait()

    def all_reduce(self, t: Any, op: str, async_op: bool = False) -> None:
        s = self.stage(t)
        self._finish(self.dist.all_reduce(s, op=self._op(op), group=self.group, async_op=async_op))
        self.restore(s, t)

    def all_reduce_coalesced(self, ts: list, op: str, async_op: bool = False) -> None:
        staged = [self.stage(t) for t in ts]
        self._finish(self.dist.all_reduce_coalesced(staged, op=self._op(op), group=self.group, async_op=async_op))
        for s, t in zip(staged, ts):
            self.restore(s, t)

    def broadcast(self, t: Any, root: int, async_op: bool = False) -> None:
        s = self.stage(t)
        self._finish(self.dist.broadcast(s, src=root, group=self.group, async_op=async_op))
        self.restore(s, t)

    def reduce(self, t: Any, root: int, op: str, async_op: bool = False) -> None:
        s = self.stage(t)
        self._finish(self.dist.reduce(s, dst=root, op=self._op(op), group=self.group, async_op=async_op))
        self.restore(s, t)

    def all_gather(self, outs: list, t: Any, async_op: bool = False) -> None:
        staged = [self.stage(o) for o in outs]
        self._finish(self.dist.all_gather(staged, self.stage(t), group=self.group, async_op=async_op))
        for s, o in zip(staged, outs):
            self.restore(s, o)

    def all_gather_into_tensor(self, out: Any, t: Any, async_op: bool = False) -> None:
        s = self.stage(out)
        self._finish(
            self.dist.all_gather_into_tensor(self.flatten(s), self.flatten(self.stage(t)), group=self.group, async_op=async_op)
        )
        self.restore(s, out)

    def all_gather_coalesced(self, outs: list[list], ts: list, async_op: bool = False) -> None:
        staged = [[self.stage(o) for o in row] for row in outs]
        inputs = [self.stage(t) for t in ts]
        self._finish(self.dist.all_gather_coalesced(staged, inputs, group=self.group, async_op=async_op))
        for srow, row in zip(staged, outs):
            for s, o in zip(srow, row):
                self.restore(s, o)

    def reduce_scatter(self, out: Any, ts: list, op: str, async_op: bool = False) -> None:
        s = self.stage(out)
        inputs = [self.stage(t) for t in ts]
        self._finish(self.dist.reduce_scatter(s, inputs, op=self._op(op), group=self.group, async_op=async_op))
        self.restore(s, out)

    def reduce_scatter_tensor(self, out: Any, t: Any, op: str, async_op: bool = False) -> None:
        s = self.stage(out)
        large = self.flatten(self.stage(t))
        self._finish(
            self.dist.reduce_scatter_tensor(self.flatten(s), large, op=self._op(op), group=self.group, async_op=async_op)
        )
        self.restore(s, out)


class GlooCalls(Calls):
    """The same calls on a gloo group, with what gloo needs: contiguous tensors (it reads a strided
    view as if it were contiguous), int16 as int32, AVG as a sum divided afterwards, and the
    tensors of the tensor forms flattened (gloo checks ``output.shape[0] * ranks ==
    input.shape[0]``, which fails on the stacked and 2-d shapes torch documents)."""

    def __init__(self, dist: Any, group: Any, ranks: int) -> None:
        super().__init__(dist, group)
        self.ranks = ranks

    def stage(self, t: Any) -> Any:
        import torch

        if t.dtype is torch.int16:  # .to keeps the strides: make it contiguous too
            return t.to(torch.int32, memory_format=torch.contiguous_format)
        return t if t.is_contiguous() else t.contiguous()

    def restore(self, staged: Any, t: Any) -> None:
        if staged is not t:
            t.copy_(staged)

    def flatten(self, large: Any) -> Any:
        return large.view(-1)

    def all_reduce(self, t: Any, op: str, async_op: bool = False) -> None:
        super().all_reduce(t, "SUM" if op == "AVG" else op, async_op)
        if op == "AVG":
            t.div_(self.ranks)

    def all_reduce_coalesced(self, ts: list, op: str, async_op: bool = False) -> None:
        super().all_reduce_coalesced(ts, "SUM" if op == "AVG" else op, async_op)
        if op == "AVG":
            for t in ts:
                t.div_(self.ranks)

    def reduce(self, t: Any, root: int, op: str, async_op: bool = False) -> None:
        super().reduce(t, root, "SUM" if op == "AVG" else op, async_op)
        if op == "AVG" and self.dist.get_rank(self.group) == root:
            t.div_(self.ranks)

    def reduce_scatter(self, out: Any, ts: list, op: str, async_op: bool = False) -> None:
        super().reduce_scatter(out, ts, "SUM" if op == "AVG" else op, async_op)
        if op == "AVG":
            out.div_(self.ranks)

    def reduce_scatter_tensor(self, out: Any, t: Any, op: str, async_op: bool = False) -> None:
        super().reduce_scatter_tensor(out, t, "SUM" if op == "AVG" else op, async_op)
        if op == "AVG":
            out.div_(self.ranks)


# ---------------------------------------------------------------------------- one case on one rank
@dataclass(slots=True)
class Outcome:
    problems: list[str]
    subject_s: float
    reference_s: float


class CaseRunner:
    """Runs cases on one rank: the subject call, the reference calls, the comparisons."""

    def __init__(self, torch: Any, rank: int, ranks: int, seed: int, subject: Calls, reference: GlooCalls) -> None:
        self.torch = torch
        self.rank = rank
        self.ranks = ranks
        self.seed = seed
        self.subject = subject
        self.reference = reference

    def run(self, case: Case) -> Outcome:
        gen = self.torch.Generator().manual_seed(_data_seed(self.seed, case.index, self.rank))
        return getattr(self, f"_{case.kind}")(case, gen)

    # helpers
    def _place(self, gen: Any, case: Case, numel: int, *, garbage: bool = False, shape: tuple[int, ...] | None = None) -> Placed:
        """An input of the case (or, with ``garbage``, an output to be overwritten) in its layout."""
        values = make_values(self.torch, gen, case.dtype, numel, None if garbage else case.op, self.ranks)
        return place(self.torch, gen, values, case.layout, shape or unit_shape(numel, case.layout))

    def _fresh(self, gen: Any, case: Case, shape: tuple[int, ...]) -> Placed:
        """A contiguous output of ``shape`` holding garbage."""
        return place(self.torch, gen, make_values(self.torch, gen, case.dtype, math.prod(shape), None, 1), "contiguous", shape)

    def _large_shape(self, case: Case, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The large tensor of a tensor form: the pieces stacked or concatenated."""
        return (self.ranks, *shape) if case.stacked else (self.ranks * shape[0], *shape[1:])

    def _time(self, body: Callable[[], None]) -> float:
        start = time.perf_counter()
        body()
        return time.perf_counter() - start

    def _reference_gather(self, x: Any) -> list:
        pieces = [self.torch.empty(x.shape, dtype=x.dtype) for _ in range(self.ranks)]
        self.reference.all_gather(pieces, x.clone())
        return pieces

    # the kinds
    def _all_reduce(self, case: Case, gen: Any) -> Outcome:
        x = self._place(gen, case, case.numels[0])
        expected = x.view.clone()
        t_s = self._time(lambda: self.subject.all_reduce(x.view, case.op, case.async_op))
        t_r = self._time(lambda: self.reference.all_reduce(expected, case.op))
        return Outcome(_present([check_placed(x, expected, "result")]), t_s, t_r)

    def _all_reduce_coalesced(self, case: Case, gen: Any) -> Outcome:
        xs = [self._place(gen, case, n) for n in case.numels]
        expected = [x.view.clone() for x in xs]
        t_s = self._time(lambda: self.subject.all_reduce_coalesced([x.view for x in xs], case.op, case.async_op))

        def reference() -> None:
            for e in expected:
                self.reference.all_reduce(e, case.op)

        t_r = self._time(reference)
        return Outcome(_present([check_placed(x, e, f"tensor {i}") for i, (x, e) in enumerate(zip(xs, expected))]), t_s, t_r)

    def _broadcast(self, case: Case, gen: Any) -> Outcome:
        x = self._place(gen, case, case.numels[0])
        expected = x.view.clone()
        t_s = self._time(lambda: self.subject.broadcast(x.view, case.root, case.async_op))
        t_r = self._time(lambda: self.reference.broadcast(expected, case.root))
        return Outcome(_present([check_placed(x, expected, "result")]), t_s, t_r)

    def _reduce(self, case: Case, gen: Any) -> Outcome:
        x = self._place(gen, case, case.numels[0])
        expected = x.view.clone()
        t_s = self._time(lambda: self.subject.reduce(x.view, case.root, case.op, case.async_op))
        t_r = self._time(lambda: self.reference.reduce(expected, case.root, case.op))
        # only the root's tensor is defined afterwards
        problems = [check_placed(x, expected, "result")] if self.rank == case.root else []
        return Outcome(_present(problems), t_s, t_r)

    def _all_gather(self, case: Case, gen: Any) -> Outcome:
        m = case.numels[0]
        x = self._place(gen, case, m)
        outs = [self._place(gen, case, m, garbage=True) for _ in range(self.ranks)]  # garbage: an unwritten piece shows
        mine = x.view.clone()
        t_s = self._time(lambda: self.subject.all_gather([o.view for o in outs], x.view, case.async_op))
        expected: list = []
        t_r = self._time(lambda: expected.extend(self._reference_gather(mine)))
        problems = [check_placed(o, e, f"piece of rank {r}") for r, (o, e) in enumerate(zip(outs, expected))]
        problems.append(check_unchanged(x, "input"))
        return Outcome(_present(problems), t_s, t_r)

    def _all_gather_into_tensor(self, case: Case, gen: Any) -> Outcome:
        x = self._place(gen, case, case.numels[0])
        out = self._fresh(gen, case, self._large_shape(case, tuple(x.view.shape)))
        mine = x.view.clone()
        t_s = self._time(lambda: self.subject.all_gather_into_tensor(out.view, x.view, case.async_op))
        pieces: list = []
        t_r = self._time(lambda: pieces.extend(self._reference_gather(mine)))
        expected = self.torch.stack(pieces) if case.stacked else self.torch.cat(pieces)
        return Outcome(_present([check_placed(out, expected, "output"), check_unchanged(x, "input")]), t_s, t_r)

    def _all_gather_coalesced(self, case: Case, gen: Any) -> Outcome:
        xs = [self._place(gen, case, n) for n in case.numels]
        # torch's layout: rows[rank][i] receives tensor i of that rank
        rows = [[self._place(gen, case, n, garbage=True) for n in case.numels] for _ in range(self.ranks)]
        mine = [x.view.clone() for x in xs]
        t_s = self._time(
            lambda: self.subject.all_gather_coalesced(
                [[o.view for o in row] for row in rows], [x.view for x in xs], case.async_op
            )
        )
        per_tensor: list = []
        t_r = self._time(lambda: per_tensor.extend(self._reference_gather(x) for x in mine))
        problems = [
            check_placed(rows[r][i], per_tensor[i][r], f"tensor {i} of rank {r}")
            for r in range(self.ranks)
            for i in range(len(xs))
        ]
        problems += [check_unchanged(x, f"input {i}") for i, x in enumerate(xs)]
        return Outcome(_present(problems), t_s, t_r)

    def _reduce_scatter(self, case: Case, gen: Any) -> Outcome:
        m = case.numels[0]
        inputs = [self._place(gen, case, m) for _ in range(self.ranks)]
        out = self._place(gen, case, m, garbage=True)
        expected = self.torch.empty(out.view.shape, dtype=out.view.dtype)
        mine = [i.view.clone() for i in inputs]
        t_s = self._time(lambda: self.subject.reduce_scatter(out.view, [i.view for i in inputs], case.op, case.async_op))
        t_r = self._time(lambda: self.reference.reduce_scatter(expected, mine, case.op))
        problems = [check_placed(out, expected, "output")]
        problems += [check_unchanged(x, f"input {r}") for r, x in enumerate(inputs)]
        return Outcome(_present(problems), t_s, t_r)

    def _reduce_scatter_tensor(self, case: Case, gen: Any) -> Outcome:
        m = case.numels[0]
        shard_shape = unit_shape(m, case.layout)
        large = self._place(gen, case, self.ranks * m, shape=self._large_shape(case, shard_shape))
        out = self._fresh(gen, case, shard_shape)
        # shard r is the r-th stretch of m elements in row-major order (stacked or concatenated)
        flat = large.view.reshape(-1).clone()
        t_s = self._time(lambda: self.subject.reduce_scatter_tensor(out.view, large.view, case.op, case.async_op))
        pieces = [flat[r * m : (r + 1) * m].clone().view(shard_shape) for r in range(self.ranks)]
        expected = self.torch.empty(shard_shape, dtype=out.view.dtype)
        t_r = self._time(lambda: self.reference.reduce_scatter(expected, pieces, case.op))
        return Outcome(_present([check_placed(out, expected, "output"), check_unchanged(large, "input")]), t_s, t_r)


def _where(exc: BaseException) -> str:
    """The innermost frames of an exception, by file name (no directories)."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    return " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))


def _present(items: list[str | None]) -> list[str]:
    return [i for i in items if i is not None]


def _data_seed(seed: int, index: int, rank: int) -> int:
    return ((seed * 1_000_003 + index) * 4099 + rank) & (2**62 - 1)


# ---------------------------------------------------------------------------- the ranks
@dataclass(frozen=True, slots=True)
class SoakConfig:
    """Everything a rank needs (picklable)."""

    backend: str
    seed: int
    start: int
    collectives: int
    timeout_s: float
    max_errors: int
    mix: Mix


@dataclass(slots=True)
class KindStats:
    """One rank's figures for one kind (times summed over its collectives)."""

    count: int = 0
    subject_time_s: float = 0.0
    reference_time_s: float = 0.0
    case_time_s: float = 0.0
    """Whole cases: making the data, both calls, the checks (not the control flag)."""


@dataclass(slots=True)
class RankReport:
    """What one rank writes for the launcher (JSON)."""

    rank: int
    executed: int = 0
    loop_wall_s: float = 0.0
    setup_s: float = 0.0
    control_time_s: float = 0.0
    stopped_early: bool = False
    torch_version: str = ""
    topocoll_from_checkout: bool = False
    kinds: dict[str, KindStats] = field(default_factory=dict)
    wrong_indices: list[int] = field(default_factory=list)
    error_indices: list[int] = field(default_factory=list)
    wrong_cases: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    slowest: list[tuple[float, int]] = field(default_factory=list)
    """The slowest cases (seconds, index), slowest first."""


SLOWEST_KEPT = 10


def rank_main(rank: int, config: SoakConfig, store_file: str, report_file: str, progress: Any) -> None:
    """One rank: join the groups, run the cases, write a JSON report to ``report_file``."""
    # torch 2.13 announces the deprecation of the coalesced and tensor forms; they are what is soaked
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` (will be|is) deprecated", category=FutureWarning)
    report = RankReport(rank)
    started = time.perf_counter()
    try:
        _soak(rank, config, store_file, report, progress, started)
    except Exception as exc:  # setup failed: record it, the launcher reads the report
        report.errors.append(
            {"rank": rank, "index": None, "kind": None, "message": f"{type(exc).__name__}: {exc} (at {_where(exc)})"}
        )
    Path(report_file).write_text(json.dumps(asdict(report)))


def _soak(rank: int, config: SoakConfig, store_file: str, report: RankReport, progress: Any, started: float) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import topocoll.collectives  # (registers "topo")

    torch.set_num_threads(1)
    report.torch_version = torch.__version__
    report.topocoll_from_checkout = Path(topocoll.collectives.__file__).resolve().is_relative_to(REPO_ROOT)
    n = config.mix.ranks
    timeout = timedelta(seconds=config.timeout_s)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=n, timeout=timeout)
    try:
        reference_group = dist.group.WORLD
        subject_group = dist.new_group(backend=config.backend, timeout=timeout)
        # the control group outwaits a peer that is stuck in a collective until the group timeout
        control_group = dist.new_group(backend="gloo", timeout=control_timeout(config.timeout_s))
        reference = GlooCalls(dist, reference_group, n)
        subject = GlooCalls(dist, subject_group, n) if config.backend == "gloo" else Calls(dist, subject_group)
        runner = CaseRunner(torch, rank, n, config.seed, subject, reference)
        report.kinds = {k: KindStats() for k in config.mix.kinds}
        report.setup_s = time.perf_counter() - started
        loop_start = time.perf_counter()
        failed_cases = 0
        for index in range(config.start, config.start + config.collectives):
            case = draw_case(config.seed, index, config.mix)
            raised = _one_case(runner, case, report)
            # one flag per rank and case: who raised
            flags = torch.zeros(n, dtype=torch.int32)
            flags[rank] = int(raised)
            control_start = time.perf_counter()
            try:
                dist.all_reduce(flags, group=control_group)
            except Exception as exc:
                report.errors.append(
                    {
                        "rank": rank,
                        "index": index,
                        "kind": "control",
                        "case": case.describe(),
                        "message": f"{type(exc).__name__}: {exc}"[:2000],
                    }
                )
                report.stopped_early = True
                break
            report.control_time_s += time.perf_counter() - control_start
            progress[rank] = report.executed
            if int(flags.sum()):
                failed_cases += 1
                if int(flags.sum()) < n or failed_cases >= config.max_errors:
                    report.stopped_early = index + 1 < config.start + config.collectives
                    break
        report.loop_wall_s = time.perf_counter() - loop_start
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # a group broken by a timeout may not close cleanly; the report matters
            pass


def _one_case(runner: CaseRunner, case: Case, report: RankReport) -> bool:
    """Run one case and record it; True when it raised."""
    stats = report.kinds[case.kind]
    stats.count += 1
    report.executed += 1
    start = time.perf_counter()
    try:
        outcome = runner.run(case)
    except Exception as exc:
        report.error_indices.append(case.index)
        if sum(e["kind"] == case.kind for e in report.errors) < MAX_DETAILED_PER_KIND:
            message = f"{type(exc).__name__}: {exc} (at {_where(exc)})"
            report.errors.append(
                {"rank": report.rank, "index": case.index, "kind": case.kind, "case": case.describe(), "message": message[:2000]}
            )
        outcome = None
    elapsed = time.perf_counter() - start
    stats.case_time_s += elapsed
    report.slowest = sorted([*report.slowest, (elapsed, case.index)], reverse=True)[:SLOWEST_KEPT]
    if outcome is None:
        return True
    stats.subject_time_s += outcome.subject_s
    stats.reference_time_s += outcome.reference_s
    if outcome.problems:
        report.wrong_indices.append(case.index)
        if sum(w["kind"] == case.kind for w in report.wrong_cases) < MAX_DETAILED_PER_KIND:
            report.wrong_cases.append(
                {"index": case.index, "kind": case.kind, "case": case.describe(), "problems": outcome.problems[:4]}
            )
    return False


def control_timeout(timeout_s: float) -> Any:
    """Timeout of the control group: a peer may first sit out one group timeout in a collective."""
    from datetime import timedelta

    return timedelta(seconds=2 * timeout_s + 30)


# ---------------------------------------------------------------------------- the launcher
def launch(config: SoakConfig) -> tuple[list[dict | None], list[dict], list[int | None], float]:
    """Run the ranks; returns their reports (None where a rank wrote none), launcher errors,
    exit codes and the wall time. Ranks still running when this returns or raises are killed."""
    import multiprocessing

    n = config.mix.ranks
    context = multiprocessing.get_context("spawn")
    progress = context.Array("q", n, lock=False)
    launcher_errors: list[dict] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="topocoll-soak-") as workdir:
        store_file = os.path.join(workdir, "store")  # fresh every run: a stale FileStore breaks rendezvous
        report_files = [os.path.join(workdir, f"rank{r}.json") for r in range(n)]
        procs = [
            context.Process(target=rank_main, args=(r, config, store_file, report_files[r], progress), daemon=True)
            for r in range(n)
        ]
        try:
            for p in procs:
                p.start()
            launcher_errors += _watch(procs, progress, config.timeout_s)
            for p in procs:
                p.join(10)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        reports: list[dict | None] = []
        for r, (p, path) in enumerate(zip(procs, report_files)):
            if os.path.exists(path):
                reports.append(json.loads(Path(path).read_text()))
                continue
            reports.append(None)
            if not any(e["rank"] == r for e in launcher_errors):
                message = f"wrote no report (exit code {p.exitcode})"
                launcher_errors.append({"rank": r, "index": None, "kind": None, "message": message})
    return reports, launcher_errors, [p.exitcode for p in procs], time.monotonic() - started


def _watch(procs: Sequence[Any], progress: Any, timeout_s: float) -> list[dict]:
    """Wait for the ranks; kill them all when none has finished a collective for too long."""
    # longer than any wait of a rank that is still alive: a collective, then the control flag
    stall_s = timeout_s + control_timeout(timeout_s).total_seconds() + 60
    seen = tuple(progress)
    last_change = time.monotonic()
    while any(p.is_alive() for p in procs):
        time.sleep(0.2)
        now_seen = tuple(progress)
        if now_seen != seen:
            seen, last_change = now_seen, time.monotonic()
        elif time.monotonic() - last_change > stall_s:
            killed = []
            for r, p in enumerate(procs):
                if p.is_alive():
                    p.kill()
                    message = f"no progress for {stall_s:.0f} s after {progress[r]} collectives: killed"
                    killed.append({"rank": r, "index": None, "kind": None, "message": message})
            return killed
    return []


def summarize(
    config: SoakConfig,
    reports: list[dict | None],
    launcher_errors: list[dict],
    exit_codes: Sequence[int | None],
    launch_wall_s: float,
) -> dict:
    """Merge the ranks' reports: a case is wrong (or raised) when it was so on any rank. A rank
    that wrote its report and then exited with a failure (aborted while shutting down) is listed
    under ``teardown_failures``: not a collective's error, but shown."""
    present = [r for r in reports if r is not None]
    # a rank that failed only while shutting down, after its report was complete
    teardown_failures = [
        {"rank": r, "exit_code": code}
        for r, (report, code) in enumerate(zip(reports, exit_codes))
        if report is not None and code != 0
    ]
    executed = max((r["executed"] for r in present), default=0)
    cases = {}

    def case_of(index: int) -> Case:
        if index not in cases:
            cases[index] = draw_case(config.seed, index, config.mix)
        return cases[index]

    wrong = sorted({i for r in present for i in r["wrong_indices"]})
    raised = sorted({i for r in present for i in r["error_indices"]})
    details: dict[int, dict] = {}
    for r in present:
        for w in r["wrong_cases"]:
            entry = details.setdefault(w["index"], {"index": w["index"], "case": w["case"], "ranks": [], "problems": []})
            entry["ranks"].append(r["rank"])
            entry["problems"].extend(f"rank {r['rank']}: {p}" for p in w["problems"][:2])
    errors = [e for r in present for e in r["errors"]] + launcher_errors
    errors.sort(key=lambda e: (e["index"] is None, e["index"] or 0, e["rank"]))
    # errors outside the collectives: set-up, the control flag, ranks that died or hung
    other_errors = [e for e in errors if e["index"] is None or e["kind"] == "control"]
    grouped: dict[int, dict] = {}
    for e in errors:
        if e in other_errors:
            continue
        entry = grouped.setdefault(
            e["index"], {"index": e["index"], "kind": e["kind"], "case": e["case"], "ranks": [], "messages": []}
        )
        entry["ranks"].append(e["rank"])
        if len(entry["messages"]) < 2 and all(m.split(": ", 2)[-1] != e["message"].split(": ", 2)[-1] for m in entry["messages"]):
            entry["messages"].append(e["message"])
    per_kind = {}
    for kind in config.mix.kinds:
        stats = [r["kinds"].get(kind, {}) for r in present]
        kind_wrong = [i for i in wrong if case_of(i).kind == kind]
        per_kind[kind] = {
            "count": max((s.get("count", 0) for s in stats), default=0),
            "wrong": len(kind_wrong),
            "errors": sum(1 for i in raised if case_of(i).kind == kind),
            # the slowest rank's sums
            "subject_time_s": max((s.get("subject_time_s", 0.0) for s in stats), default=0.0),
            "reference_time_s": max((s.get("reference_time_s", 0.0) for s in stats), default=0.0),
            "case_time_s": max((s.get("case_time_s", 0.0) for s in stats), default=0.0),
            "wrong_by_dtype": _count_by(case_of(i).dtype for i in kind_wrong),
        }
    loop_wall_s = max((r["loop_wall_s"] for r in present), default=0.0)
    slowest = sorted({(round(t, 6), i) for r in present for t, i in r["slowest"]}, reverse=True)
    seen_slow: dict[int, float] = {}
    for t, i in slowest:
        seen_slow.setdefault(i, t)
    torch_version = next((r["torch_version"] for r in present if r["torch_version"]), "")
    return {
        "format": FORMAT,
        "backend": config.backend,
        "reference": "gloo",
        "seed": config.seed,
        "start": config.start,
        "ranks": config.mix.ranks,
        "options": {
            "collectives": config.collectives,
            "kinds": list(config.mix.kinds),
            "dtypes": list(config.mix.dtypes),
            "max_bytes": config.mix.max_bytes,
            "irregular_fraction": config.mix.irregular_fraction,
            "async_fraction": config.mix.async_fraction,
            "timeout_s": config.timeout_s,
            "max_errors": config.max_errors,
        },
        "topocoll_from_checkout": bool(present) and all(r["topocoll_from_checkout"] for r in present),
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch_version,
            "machine": platform.machine(),
        },
        "totals": {
            "collectives": executed,
            "wrong": len(wrong),
            "errors": len(raised) + len(other_errors),
            "wall_s": loop_wall_s,
            "launch_wall_s": launch_wall_s,
            "setup_s": max((r["setup_s"] for r in present), default=0.0),
            "control_time_s": max((r["control_time_s"] for r in present), default=0.0),
            "collectives_per_s": executed / loop_wall_s if loop_wall_s > 0 else 0.0,
            "stopped_early": any(r["stopped_early"] for r in present) or len(present) < len(reports),
        },
        "exit_codes": list(exit_codes),
        "teardown_failures": teardown_failures,
        "per_kind": per_kind,
        "wrong_indices": wrong,
        "error_indices": raised,
        "wrong_cases": [details[i] for i in sorted(details)],
        "errors": [grouped[i] for i in sorted(grouped)],
        "other_errors": other_errors,
        "slowest_cases": [
            {"index": i, "case_s": t, "case": case_of(i).describe()} for i, t in list(seen_slow.items())[:SLOWEST_KEPT]
        ],
    }


def _count_by(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items()))


def _last_line(message: str) -> str:
    lines = message.strip().splitlines()
    return lines[-1] if lines else "(no message)"


def print_summary(summary: dict, shown: int = 10) -> None:
    """The table (per kind: count, wrong, errors, seconds in the subject, in the reference and in
    whole cases, the slowest rank's sums), then the first wrong cases, errors and slowest cases."""
    totals = summary["totals"]
    host = summary["host"]
    print(
        f"soak: {summary['backend']} checked against gloo, {summary['ranks']} ranks, seed {summary['seed']}, "
        f"torch {host['torch']}, {host['cpus']} cores"
    )
    if not summary["topocoll_from_checkout"]:
        print("note: the ranks imported a topocoll other than the one of this checkout")
    subject = summary["backend"]
    print(f"{'kind':<24} {'count':>6} {'wrong':>6} {'errors':>6} {subject + ' s':>9} {'ref s':>9} {'case s':>9}  wrong dtypes")
    for kind, row in summary["per_kind"].items():
        dtypes = ", ".join(f"{d} {c}" for d, c in row["wrong_by_dtype"].items())
        print(
            f"{kind:<24} {row['count']:>6} {row['wrong']:>6} {row['errors']:>6} "
            f"{row['subject_time_s']:>9.2f} {row['reference_time_s']:>9.2f} {row['case_time_s']:>9.2f}  {dtypes}"
        )
    print(
        f"{'total':<24} {totals['collectives']:>6} {totals['wrong']:>6} {totals['errors']:>6}  "
        f"in {totals['wall_s']:.1f} s, {totals['collectives_per_s']:.1f} collectives/s "
        f"({totals['setup_s']:.1f} s to start, {totals['control_time_s']:.1f} s in control flags)"
        f"{'; stopped early' if totals['stopped_early'] else ''}"
    )
    for w in summary["wrong_cases"][:shown]:
        print(f"wrong {w['case']} (ranks {w['ranks']}): {w['problems'][0]}")
    if totals["wrong"] > shown:
        print(f"... {totals['wrong'] - shown} more wrong cases (indices in the JSON)")
    for e in summary["errors"][:shown]:
        print(f"error in {e['case']} on rank(s) {e['ranks']}: {_last_line(e['messages'][0])}")
    for e in summary["other_errors"][:shown]:
        where = f" after {e['case']}" if e.get("case") else ""
        print(f"error on rank {e['rank']}{where}: {_last_line(e['message'])}")
    if totals["errors"] > shown:
        print(f"... {totals['errors'] - shown} more errors (indices in the JSON)")
    for t in summary["teardown_failures"]:
        print(f"note: rank {t['rank']} exited with code {t['exit_code']} after writing its report (while shutting down)")
    slow = summary["slowest_cases"][:3]
    if slow:
        print("slowest: " + "; ".join(f"{c['case']} {c['case_s']:.2f} s" for c in slow))


# ---------------------------------------------------------------------------- command line
def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4M, 512K, 65536)") from None


def _names(allowed: Sequence[str], what: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n for n in text.replace(",", " ").split() if n]
        unknown = [n for n in names if n not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}")
        return names

    return parse


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], got {value}")
    return value


EPILOG = f"""\
kinds: {", ".join(KINDS)}
dtypes: {", ".join(DTYPES)} (default: {", ".join(INTEGER_DTYPES)})

examples:
  # the soak: 5000 collectives on 4 ranks, figures into a JSON file
  python benchmarks/soak.py --ranks 4 --collectives 5000 --seed 1 -o benchmarks/results/soak.json
  # check the soak itself: the subject is a second gloo group, so every result must agree
  python benchmarks/soak.py --backend gloo --collectives 2000
  # leave a kind out, or soak only some kinds
  python benchmarks/soak.py --skip-kinds all_gather_coalesced
  python benchmarks/soak.py --kinds reduce,broadcast --dtypes int8,bool
  # rerun case 1234 of seed 1 alone (keep the other options of the run that found it)
  python benchmarks/soak.py --seed 1 --start 1234 --collectives 1
  # go on past collectives that raised on every rank (up to 50 of them)
  python benchmarks/soak.py --max-errors 50

exit status: 0 when every result agreed with gloo and nothing raised, 1 otherwise, 2 for bad options.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="soak.py",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ranks", type=int, default=4, help="processes to start (default 4)")
    parser.add_argument("--collectives", type=int, default=2000, help="random collectives to run (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the cases and the data (default 0)")
    parser.add_argument(
        "--start", type=int, default=0, help="index of the first case (default 0): with --collectives 1, reruns one case"
    )
    parser.add_argument(
        "--backend",
        choices=("topo", "gloo"),
        default="topo",
        help="the group under test (default topo; gloo checks the soak itself)",
    )
    parser.add_argument(
        "--kinds", type=_names(KINDS, "kind"), default=list(KINDS), help="comma-separated kinds to draw from (default: all)"
    )
    parser.add_argument("--skip-kinds", type=_names(KINDS, "kind"), default=[], help="comma-separated kinds to leave out")
    parser.add_argument(
        "--dtypes",
        type=_names(DTYPES, "dtype"),
        default=list(INTEGER_DTYPES),
        help="comma-separated dtypes to draw from (default: the integer ones and bool)",
    )
    parser.add_argument(
        "--max-bytes", type=_size, default=4 << 20, help="largest tensor of a collective, e.g. 4M (default), 256K"
    )
    parser.add_argument(
        "--irregular-fraction",
        type=_fraction,
        default=0.3,
        help="share of cases with strided, transposed or offset tensors (default 0.3)",
    )
    parser.add_argument(
        "--async-fraction",
        type=_fraction,
        default=0.25,
        help="share of cases issued with async_op=True and waited on (default 0.25)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=60.0, help="process-group timeout of every group, seconds (default 60)"
    )
    parser.add_argument(
        "--max-errors", type=int, default=1, help="stop after this many collectives raised (default 1: at the first)"
    )
    parser.add_argument("-o", "--out", type=Path, default=None, help="write the JSON report here (default: print only)")
    return parser


def main(argv: list[str] | None = None) -> int:
    # a terminated launcher unwinds (and kills its ranks) instead of leaving them behind
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = build_parser()
    args = parser.parse_args(argv)
    kinds = tuple(k for k in KINDS if k in args.kinds and k not in args.skip_kinds)
    if args.collectives < 0 or args.start < 0:
        parser.error("--collectives and --start must be >= 0")
    if args.timeout_s <= 0 or args.max_errors < 1:
        parser.error("--timeout-s must be > 0 and --max-errors >= 1")
    try:
        mix = Mix(
            kinds,
            tuple(d for d in DTYPES if d in args.dtypes),
            args.ranks,
            args.max_bytes,
            args.irregular_fraction,
            args.async_fraction,
        )
    except ValueError as exc:
        parser.error(str(exc))
    config = SoakConfig(args.backend, args.seed, args.start, args.collectives, args.timeout_s, args.max_errors, mix)
    reports, launcher_errors, exit_codes, launch_wall_s = launch(config)
    summary = summarize(config, reports, launcher_errors, exit_codes, launch_wall_s)
    print_summary(summary)
    if args.out is not None:
        from topocoll.fileio import write_atomic

        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out, json.dumps(summary, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.out}")
    totals = summary["totals"]
    return 1 if totals["wrong"] or totals["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
