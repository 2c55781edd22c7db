"""StatusEchoes: which watch events are the echo of our own status write (no pass), and that an event held
back during a write gets its pass when the write shows it was not ours."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from domain.objects import ShardState
from domain.resources import SHARDS
from reconciler.runtime import StatusEchoes


def shard(version: str, count: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": "shard-a", "generation": 1, "resourceVersion": version},
        "status": {"databaseCount": count},
    }


class Apiserver:
    """Answers a status patch with the next version; `during` runs while the patch is in flight (an event
    that the informer delivers before the write returns)."""

    def __init__(self, answer: str, during: Callable[[], None] = lambda: None, fail: int | None = None) -> None:
        self.answer, self.during, self.fail = answer, during, fail

    def patch(self, resource: Any, name: str, body: dict[str, Any], namespace: str | None = None, **kw: Any) -> Any:
        self.during()
        if self.fail is not None:
            raise ApiException(status=self.fail)
        return {"metadata": {"name": name, "resourceVersion": self.answer}, "status": body["status"]}


def write(echoes: StatusEchoes, apiserver: Apiserver, read: str = "7", count: int = 3) -> None:
    echoes.write(apiserver, SHARDS, ShardState.parse(shard(read)).with_status(database_count=count))  # type: ignore[arg-type]


def echoes_queueing() -> tuple[StatusEchoes, list[str]]:
    queued: list[str] = []
    echoes = StatusEchoes(queued.append)
    return echoes, queued


def test_the_event_of_our_write_is_its_echo_once_and_others_are_not() -> None:
    echoes, queued = echoes_queueing()
    assert not echoes.echo(shard("6"), shard("7"))  # nothing written yet
    write(echoes, Apiserver("8"))
    assert not echoes.echo(shard("8"), shard("9"))  # another writer's later version
    assert not echoes.echo(shard("8"), None)  # a deletion
    assert not echoes.echo(None, shard("8"))  # an object added
    assert echoes.echo(shard("7"), shard("8", 3))
    assert not echoes.echo(shard("7"), shard("8", 3))  # delivered again (a relist): a pass, as before
    assert queued == []


def test_a_write_of_nothing_or_a_forgotten_object_leaves_no_echo() -> None:
    echoes, _ = echoes_queueing()
    echoes.write(Apiserver("8"), SHARDS, ShardState.parse(shard("7")))  # type: ignore[arg-type]  # unchanged: not sent
    assert not echoes.echo(shard("7"), shard("8"))
    write(echoes, Apiserver("8"))
    echoes.forget("shard-a")
    assert not echoes.echo(shard("7"), shard("8"))


def test_an_echo_that_comes_before_the_write_returns_is_one() -> None:
    echoes, queued = echoes_queueing()
    seen: list[bool] = []
    write(echoes, Apiserver("8", during=lambda: seen.append(echoes.echo(shard("7"), shard("8", 3)))))
    assert seen == [True] and queued == []
    assert not echoes.echo(shard("8"), shard("9"))


@pytest.mark.parametrize(("answer", "fail"), [("9", None), ("8", 409)], ids=["folded-into-a-later-version", "conflict"])
def test_an_event_held_back_during_a_write_gets_its_pass_if_it_was_not_ours(answer: str, fail: int | None) -> None:
    echoes, queued = echoes_queueing()
    seen: list[bool] = []
    during = lambda: seen.append(echoes.echo(shard("7"), shard("8", 99)))  # noqa: E731 - another writer's version
    if fail is None:
        write(echoes, Apiserver(answer, during))
    else:
        with pytest.raises(ApiException):
            write(echoes, Apiserver(answer, during, fail))
    assert seen == [True] and queued == ["shard-a"]
