"""A fenced client bounds its writes (not its reads, not a caller's own timeout) below the renew deadline."""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiClient, Configuration

from domain.resources import SHARDS
from informers.rest import DEFAULT_TIMEOUT, Rest


class RecordingClient(ApiClient):
    """Sends nothing: records the timeout each request would have had."""

    def __init__(self) -> None:
        configuration = Configuration()
        configuration.host = "https://127.0.0.1:1"
        super().__init__(configuration)
        self.timeouts: list[tuple[str, Any]] = []

    def call_api(self, method: str, url: str, *args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        self.timeouts.append((method, _request_timeout))
        raise RuntimeError("not sent")


def sent_timeout(rest: Rest, call: Any) -> Any:
    client = rest.api_client
    assert isinstance(client, RecordingClient)
    try:
        call()
    except RuntimeError:
        pass
    return client.timeouts.pop()[1]


def test_writes_of_a_fenced_client_get_its_write_timeout() -> None:
    rest = Rest(RecordingClient()).fenced(lambda: None, write_timeout=(1.0, 2.0))
    shard = {"metadata": {"name": "a"}}
    assert sent_timeout(rest, lambda: rest.patch(SHARDS, "a", {"spec": {}})) == (1.0, 2.0)
    assert sent_timeout(rest, lambda: rest.create(SHARDS, shard)) == (1.0, 2.0)
    assert sent_timeout(rest, lambda: rest.delete(SHARDS, "a")) == (1.0, 2.0)
    assert sent_timeout(rest, lambda: rest.get(SHARDS, "a")) == DEFAULT_TIMEOUT  # reads keep the default
    assert sent_timeout(rest, lambda: rest.patch(SHARDS, "a", {}, timeout=(5.0, 5.0))) == (5.0, 5.0)


def test_an_unfenced_client_keeps_the_default() -> None:
    rest = Rest(RecordingClient())
    assert sent_timeout(rest, lambda: rest.patch(SHARDS, "a", {"spec": {}})) == DEFAULT_TIMEOUT
