"""When a Database pass may trust a cache that does not show its own last write (reconciler.database.writes)."""

from __future__ import annotations

from reconciler.database.writes import _later


def test_only_a_known_later_version_is_trusted() -> None:
    assert _later("813", "812")  # another writer's change after ours: the cache already has it
    assert not _later("811", "812")  # the cache lags our write: wait for its event
    assert not _later("812", "812")
    assert not _later(None, "812")  # gone from the cache
    # Not etcd revisions (an apiserver with another storage): never called later, so the pass waits, then reads live.
    assert not _later("b7", "a3")
    assert not _later("813", "opaque-812")
