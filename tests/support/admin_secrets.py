"""Shard admin Secrets under names the test install lists in shardSecrets.

The provider uses only listed Secrets as admin credentials, and the install config is fixed for a
manager's life, so the suites list a few slot names up front (`shard_secrets`) and each test's
fleet fills them: one slot per (user, password), shared by the shards of one server.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from informers import SECRETS, Rest
from tests.support.common import b64

SLOTS = 12


def slot_names(release: str) -> list[str]:
    return [f"{release}-admin-{index}" for index in range(SLOTS)]


def shard_secrets(release: str, namespace: str) -> list[dict[str, str]]:
    """The install config's shardSecrets entries of the slots."""
    return [{"namespace": namespace, "name": name} for name in slot_names(release)]


class AdminSecrets:
    """Writes admin Secrets into the slots of one test and deletes them afterwards."""

    def __init__(self, rest: Rest, release: str, namespace: str) -> None:
        self.rest = rest
        self.namespace = namespace
        self._free = slot_names(release)
        self._used: dict[tuple[str, str], str] = {}

    def secret(self, user: str, password: str) -> str:
        """The name of a listed Secret holding `user` and `password` (keys `user`, `password`)."""
        name = self._used.get((user, password))
        if name is not None:
            return name
        if not self._free:
            raise RuntimeError(f"a test used more than {SLOTS} admin Secrets; raise tests.support.admin_secrets.SLOTS")
        name = self._free.pop(0)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": self.namespace},
            "data": {"user": b64(user), "password": b64(password)},
        }
        try:
            self.rest.create(SECRETS, body, self.namespace)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.rest.replace(SECRETS, body)  # left by an interrupted run
        self._used[(user, password)] = name
        return name

    def cleanup(self) -> None:
        for name in self._used.values():
            try:
                self.rest.delete(SECRETS, name, self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self._used.clear()
