"""The registry's rules over records, without etcd (casfs.replica.records)."""

from __future__ import annotations

import pytest

from casfs.errors import Busy, UsageError
from casfs.replica import records as rec


def entry(node: str, n: int, root: str | None = None, state: str = rec.OK) -> rec.Entry:
    return rec.Entry(node, f"/s/{node}", f"/s/{node}", n, root or (f"r{n}" if n else None), state, 0.0, 1)


def node(name: str, free: int = 100) -> rec.Node:
    return rec.Node(name, f"/s/{name}", f"/s/{name}", free, 1, 0.0)


VOL = rec.Volume("v", 3, "dir", {"store": "s1", "volume": "v"})
ALL = {"n1", "n2", "n3", "n4"}


def test_lag_and_health() -> None:
    es = [entry("n1", 5), entry("n2", 4), entry("n3", 2), entry("n4", 5, state=rec.LEAVING)]
    assert [rec.lag(e, es) for e in es] == [0, 1, 3, 0]
    assert [rec.healthy(e, es, ALL) for e in es] == [True, True, False, False]
    assert not rec.healthy(es[0], es, {"n2"})  # (its agent is not alive)
    fresh = [entry("n1", 0), entry("n2", 0)]
    assert all(rec.healthy(e, fresh, ALL) for e in fresh)  # (nothing anywhere yet)
    assert not rec.healthy(entry("n3", 0), [*es, entry("n3", 0)], ALL)


def test_source_is_the_newest_alive_other() -> None:
    es = [entry("n1", 3), entry("n2", 5), entry("n3", 6)]
    assert rec.source_for("n1", es, ALL) == es[2]
    assert rec.source_for("n1", es, {"n1", "n2"}) == es[1]  # (n3 is not alive)
    assert rec.source_for("n3", es, ALL) is None


def test_creator_fewest_replicas_then_most_free() -> None:
    nodes = [node("n1"), node("n2", 50), node("n3", 900), node("n4", 900)]
    es = [entry("n1", 1)]
    assert rec.creator(VOL, es, nodes, {"n1": 1, "n3": 2}) == "n4"  # (n3 holds more replicas)
    assert rec.creator(VOL, es, nodes, {}) == "n3"  # (most free; by name on a tie)
    full = [entry("n1", 1), entry("n2", 1), entry("n3", 1)]
    assert rec.creator(VOL, full, nodes, {}) is None
    leaving = [entry("n1", 1), entry("n2", 1), entry("n3", 1, state=rec.LEAVING)]
    assert rec.creator(VOL, leaving, nodes, {}) == "n4"


def test_removal_needs_k_others_at_least_as_new() -> None:
    es = [entry("n1", 5), entry("n2", 5), entry("n3", 5), entry("n4", 5)]
    assert rec.removal_refused(VOL, "n4", es, ALL) is None
    assert "fewer than 3" in str(rec.removal_refused(VOL, "n4", es, ALL - {"n1"}))
    behind = [entry("n1", 5), entry("n2", 5), entry("n3", 4), entry("n4", 5)]
    assert rec.removal_refused(VOL, "n4", behind, ALL) is not None  # (n3 is not as new)
    assert "no replica" in str(rec.removal_refused(VOL, "n9", es, ALL))


def test_the_last_good_copy_stays_whatever_the_factor() -> None:
    one = rec.Volume("v", 1, "dir", {})
    assert rec.removal_refused(one, "n1", [entry("n1", 3), entry("n2", 2)], ALL) is not None
    assert rec.removal_refused(one, "n2", [entry("n1", 3), entry("n2", 2)], ALL) is None
    assert rec.removal_refused(one, "n1", [entry("n1", 3)], ALL) is not None


def test_the_active_node_is_not_removed() -> None:
    held = rec.take_active(VOL, "n1", 7, ALL, 5, 1.0)
    es = [entry(n, 5) for n in sorted(ALL)]
    assert "active" in str(rec.removal_refused(held, "n1", es, ALL))


def test_active_refused_while_alive_taken_over_when_not() -> None:
    held = rec.take_active(VOL, "n1", 7, ALL, 5, 1.0)
    assert held.active == rec.Active("n1", 7, 1.0) and held.takeovers == ()
    with pytest.raises(Busy, match="n1"):
        rec.take_active(held, "n2", 8, ALL, 5, 2.0)
    again = rec.take_active(held, "n1", 9, ALL, 5, 2.0)  # (the holder itself, a new lease)
    assert again.active == rec.Active("n1", 9, 2.0) and again.takeovers == ()
    taken = rec.take_active(held, "n2", 8, ALL - {"n1"}, 5, 3.0)
    assert taken.active is not None and taken.active.node == "n2"
    assert taken.takeovers == (rec.Takeover("n1", "n2", 3.0, 5),)
    assert rec.release_active(taken, "n1") is None
    released = rec.release_active(taken, "n2")
    assert released is not None and released.active is None and released.takeovers == taken.takeovers


def test_divergence_is_another_root_at_the_same_number() -> None:
    es = [entry("n1", 2, "a"), entry("n2", 2, "b")]
    assert rec.diverged("n1", 2, "a", es) and not rec.diverged("n1", 2, "b", es)
    assert not rec.diverged("n1", 3, "c", es) and not rec.diverged("n1", 0, None, es)


def test_records_round_trip_through_json() -> None:
    v = rec.take_active(rec.Volume("v", 2, "block", {"store": "x", "volume": "v"}, {"last": 3, "hourly": None,
                        "daily": 7}), "n1", 5, set(), 0, 1.0)  # fmt: skip
    v = rec.take_active(v, "n2", 6, set(), 4, 2.0)
    assert rec.Volume.from_json(v.to_json()) == v
    e = entry("n1", 4)
    assert rec.Entry.from_json(e.to_json()) == e
    n = node("n1")
    assert rec.Node.from_json(n.to_json()) == n


def test_factor_is_positive() -> None:
    assert rec.check_factor(2) == 2
    with pytest.raises(UsageError):
        rec.check_factor(0)
