"""The LP module: the packing master problem's budget rows and their duals."""

from __future__ import annotations

import pytest

from topocoll.errors import SolverError
from topocoll.solver import lp


def test_a_budget_caps_its_columns_and_prices_them():
    """One group, two edges of capacity 1: column A loads edge 0, column B edge 1. Unbounded,
    each takes half (tau 0.5). With B's budget at 0.25, A must carry 0.75: tau 0.75, and one
    more unit of budget would shift a unit from A to B, lowering tau by 1: the budget's dual."""
    a = lp.PackingColumn(0, ((0, 1.0),))
    b = lp.PackingColumn(0, ((1, 1.0),), uses=((0, 1.0),))
    free = lp.solve_packing(1, [1.0, 1.0], [a, b], budgets=[1.0, 1.0])
    assert free.tau == pytest.approx(0.5) and free.budget_duals == (0.0, 0.0)
    capped = lp.solve_packing(1, [1.0, 1.0], [a, b], budgets=[0.25, 3.0])
    assert capped.status is lp.LPStatus.OPTIMAL
    assert capped.tau == pytest.approx(0.75)
    assert capped.weights == pytest.approx((0.75, 0.25))
    assert capped.budget_duals == pytest.approx((1.0, 0.0))  # budget 1 is used by no column
    # reduced costs of the columns in the basis are zero: load * pi + use * beta == mu
    for column, weight in zip((a, b), capped.weights):
        price = sum(load * capped.edge_duals[e] for e, load in column.loads) + sum(u * capped.budget_duals[i] for i, u in column.uses)
        assert price == pytest.approx(capped.group_duals[0])


def test_a_column_naming_a_budget_not_given_is_refused():
    column = lp.PackingColumn(0, ((0, 1.0),), uses=((2, 1.0),))
    with pytest.raises(SolverError, match="uses budget 2; 1 budgets given"):
        lp.solve_packing(1, [1.0], [column], budgets=[1.0])
