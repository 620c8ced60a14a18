"""The one module that talks to the LP library (PuLP, over HiGHS or CBC).

It solves the master problem of tree packing::

    minimise    tau
    subject to  sum of y_k over the columns k of group g  = 1      for every group g  (dual mu_g)
                tau * cap_e - sum_k load_k(e) * y_k       >= 0      for every edge e   (dual pi_e >= 0)
                limit_b - sum_k use_k(b) * y_k            >= 0      for every budget b (dual beta_b >= 0)
                y_k >= 0

A column is a tree carrying a fraction ``y_k`` of its group's data (a group is a root's shard);
``tau`` is the time to move one unit of every group. Budgets are optional rows that cap a sum
of columns by a constant, not by ``tau`` (the shards' parts that may be forwarded:
:func:`topocoll.solver.traffic.route_two_hop`); a column's reduced cost is then
``sum_e load_k(e) pi_e + sum_b use_k(b) beta_b - mu_g``. The duals price the next column
(:func:`topocoll.solver.packing.pack_trees`). The solver is always named explicitly: HiGHS through
highspy by default, CBC as the fallback.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pulp

from topocoll.errors import SolverError

log = logging.getLogger(__name__)


class LPStatus(str, enum.Enum):
    """Outcome of one LP solve."""

    OPTIMAL = "optimal"
    TIME_LIMIT = "time_limit"
    INFEASIBLE = "infeasible"
    ERROR = "error"


SOLVERS = ("highs", "cbc")


@dataclass(frozen=True, slots=True)
class PackingColumn:
    """One tree: its group, its load ``((edge_index, load), ...)`` on the edges and its use
    ``((budget_index, use), ...)`` of the budgets."""

    group: int
    loads: tuple[tuple[int, float], ...]
    uses: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class PackingSolution:
    """Primal and dual solution of the packing master problem."""

    status: LPStatus
    tau: float
    weights: tuple[float, ...]
    group_duals: tuple[float, ...]
    edge_duals: tuple[float, ...]
    solver: str
    budget_duals: tuple[float, ...] = ()


def available_solvers() -> tuple[str, ...]:
    """Names (from :data:`SOLVERS`) of the LP solvers usable here, preferred first."""
    names = set(pulp.listSolvers(onlyAvailable=True))
    found = []
    if "HiGHS" in names:
        found.append("highs")
    if "PULP_CBC_CMD" in names:
        found.append("cbc")
    return tuple(found)


def _solver(name: str, time_limit_s: float | None) -> pulp.LpSolver:
    if name == "highs":
        return pulp.HiGHS(msg=False, timeLimit=time_limit_s, threads=1)
    if name == "cbc":
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s)
    raise SolverError(f"unknown LP solver {name!r}; choose one of {', '.join(SOLVERS)}")


def _variable(problem: pulp.LpProblem, name: str) -> pulp.LpVariable:
    """A continuous variable >= 0 attached to ``problem`` (PuLP 4 style where available)."""
    if hasattr(problem, "add_variable"):
        return problem.add_variable(name, lowBound=0)
    return pulp.LpVariable(name, lowBound=0)


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence the C library's banner, which HiGHS writes straight to file descriptor 1.

    HiGHS 1.16 prints it from the constructor of the first ``highspy.Highs`` of a process,
    before any option can be set (checked: ``output_flag`` set right after construction leaves
    it on stdout), so PuLP's ``msg=False`` cannot stop it; without this a command that writes
    JSON or a table to stdout would start with the banner.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def solve_packing(
    n_groups: int,
    capacities: Sequence[float],
    columns: Sequence[PackingColumn],
    solver: str = "highs",
    time_limit_s: float | None = None,
    depths: Sequence[float] | None = None,
    tau_limit: float | None = None,
    budgets: Sequence[float] = (),
) -> PackingSolution:
    """Solve the packing master problem (see the module docstring).

    With ``depths`` and ``tau_limit`` it solves the second-stage problem instead: among the
    packings with ``tau <= tau_limit``, the one with the least weighted tree depth
    (``sum_k depths[k] * y_k``), i.e. the shallowest optimal packing, which pipelines best.

    Parameters
    ----------
    n_groups : int
        Number of groups; every group needs at least one column.
    capacities : sequence of float
        Capacity of each edge, best normalised to about 1.
    columns : sequence of PackingColumn
    solver : {"highs", "cbc"}
    time_limit_s : float, optional
    depths : sequence of float, optional
        Depth of each column's tree (second stage only).
    tau_limit : float, optional
        Largest ``tau`` allowed in the second stage.
    budgets : sequence of float
        Limit of each budget row (see the module docstring); columns name them in ``uses``.

    Returns
    -------
    PackingSolution
        ``status`` says whether the values can be trusted; duals are zero unless optimal.
    """
    problem = pulp.LpProblem("tree_packing", pulp.LpMinimize)
    tau = _variable(problem, "tau")
    weights = [_variable(problem, f"y{k}") for k in range(len(columns))]
    if depths is not None and tau_limit is not None:
        problem += pulp.LpAffineExpression([(v, float(d)) for v, d in zip(weights, depths)])
        problem += pulp.LpConstraint(pulp.LpAffineExpression([(tau, 1.0)]), pulp.LpConstraintLE, "tau_limit", tau_limit)
    else:
        problem += tau
    by_group: list[list[pulp.LpVariable]] = [[] for _ in range(n_groups)]
    by_edge: dict[int, list[tuple[pulp.LpVariable, float]]] = {}
    by_budget: list[list[tuple[pulp.LpVariable, float]]] = [[] for _ in budgets]
    for var, column in zip(weights, columns):
        by_group[column.group].append(var)
        for edge, load in column.loads:
            by_edge.setdefault(edge, []).append((var, -load))
        for budget, use in column.uses:
            if not 0 <= budget < len(by_budget):
                raise SolverError(f"a column of group {column.group} uses budget {budget}; {len(by_budget)} budgets given")
            by_budget[budget].append((var, -use))
    group_rows = []
    for g, members in enumerate(by_group):
        if not members:
            raise SolverError(f"group {g} has no column")
        row = pulp.LpConstraint(pulp.LpAffineExpression([(v, 1.0) for v in members]), pulp.LpConstraintEQ, f"g{g}", 1.0)
        problem += row
        group_rows.append(row)
    edge_rows = {}
    for edge, terms in sorted(by_edge.items()):
        expr = pulp.LpAffineExpression(terms + [(tau, capacities[edge])])
        edge_rows[edge] = pulp.LpConstraint(expr, pulp.LpConstraintGE, f"e{edge}", 0.0)
        problem += edge_rows[edge]
    budget_rows = {}
    for b, (terms, limit) in enumerate(zip(by_budget, budgets)):
        if terms:  # a budget no column uses binds nothing
            budget_rows[b] = pulp.LpConstraint(pulp.LpAffineExpression(terms), pulp.LpConstraintGE, f"b{b}", -float(limit))
            problem += budget_rows[b]
    with _quiet_stdout():
        code = problem.solve(_solver(solver, time_limit_s))
    status_text = pulp.LpStatus.get(code, "Undefined")
    if status_text == "Optimal":
        status = LPStatus.OPTIMAL
    elif status_text == "Infeasible":
        status = LPStatus.INFEASIBLE
    elif status_text == "Not Solved" and tau.value() is not None:
        status = LPStatus.TIME_LIMIT
    else:
        status = LPStatus.ERROR
    log.debug("packing LP (%s): %d columns, %d edges, status %s", solver, len(columns), len(by_edge), status.value)
    if status is not LPStatus.OPTIMAL:
        return PackingSolution(status, float(tau.value() or 0.0), tuple(float(v.value() or 0.0) for v in weights), (), (), solver)
    group_duals = tuple(float(row.pi or 0.0) for row in group_rows)
    edge_duals = [0.0] * len(capacities)
    for edge, row in edge_rows.items():
        edge_duals[edge] = max(0.0, float(row.pi or 0.0))
    return PackingSolution(
        status,
        float(tau.value()),
        tuple(max(0.0, float(v.value() or 0.0)) for v in weights),
        group_duals,
        tuple(edge_duals),
        solver,
        tuple(max(0.0, float(budget_rows[b].pi or 0.0)) if b in budget_rows else 0.0 for b in range(len(budgets))),
    )
