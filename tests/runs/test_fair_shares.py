"""Shares of the active runs, weighted: who is below its share while others have runs."""

from __future__ import annotations

import pytest

from runs.fairness import Shares

pytestmark = pytest.mark.no_services


def test_alone_nobody_is_below_a_share() -> None:
    assert not Shares(active={1: 1000}, weights={1: 1}).under_share(1)


def test_a_newcomer_is_below_its_share_the_holder_above() -> None:
    shares = Shares(active={1: 1000}, weights={1: 1, 2: 1})
    assert shares.under_share(2)
    assert not shares.under_share(1)


def test_weights_divide_the_runs() -> None:
    shares = Shares(active={1: 30, 2: 10}, weights={1: 3, 2: 1})
    assert shares.share_of(1) == 30 and shares.share_of(2) == 10
    assert not shares.under_share(1) and not shares.under_share(2)
    lighter = Shares(active={1: 29, 2: 11}, weights={1: 3, 2: 1})
    assert lighter.under_share(1) and not lighter.under_share(2)
