"""Admin sessions belong to a lane slot, not to a thread: a shard never has more sessions of the
Database workers than its lane has slots (workersPerShard), whichever worker threads hold them.
Nothing connects here (a session opens on its first statement)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from reconciler.runtime import Slot, holding_slot
from reconciler.shard.admin import AdminSessions
from reconciler.sql.session import AdminEndpoint, AdminSession

ENDPOINT = AdminEndpoint("127.0.0.1", 5432, "provisioner", "secret", sslmode="require")


def session_in(sessions: AdminSessions, slot: Slot | None, shard: str = "a") -> AdminSession:
    """The session a worker thread of its own gets for `shard` while it holds `slot`."""

    def get() -> AdminSession:
        with holding_slot(slot):
            return sessions.get(shard, ENDPOINT)

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(get).result()


def test_workers_holding_the_same_slot_one_after_another_share_its_session() -> None:
    sessions = AdminSessions()
    first = session_in(sessions, Slot("a", 0))
    assert session_in(sessions, Slot("a", 0)) is first  # another thread, same slot: same session
    assert session_in(sessions, Slot("a", 1)) is not first  # the lane's second slot: its own
    assert session_in(sessions, Slot("a", 0), shard="b") is not first  # another shard: its own


def test_outside_a_slot_a_session_belongs_to_its_thread() -> None:
    """The Shard controller's workers hold no lane slot."""
    sessions = AdminSessions()
    assert session_in(sessions, None) is not session_in(sessions, None)
    mine = sessions.get("a", ENDPOINT)
    assert sessions.get("a", ENDPOINT) is mine


def test_drop_and_close_all_forget_slot_sessions() -> None:
    sessions = AdminSessions()
    first = session_in(sessions, Slot("a", 0))
    with holding_slot(Slot("a", 0)):
        sessions.drop("a")
    second = session_in(sessions, Slot("a", 0))
    assert second is not first
    sessions.close_all()
    assert session_in(sessions, Slot("a", 0)) is not second
