"""The Shard's ClientLoginFailing condition: new databases placed on it that cannot log in at its client endpoint.

The provider runs its own SQL on the admin endpoint only, so the Shard's check cannot see the client
endpoint (pgBouncer, a load balancer) fail. The Ready login of each new database goes through it
(reconciler.database.login) and waits with reason LoginFailed until it succeeds. While at least one
Database placed on the shard waits so, the Shard says it, with the count and the first one's message
(the failure's class and the endpoint): pgBouncer stopped or paused, its auth_query failing (the auth
user's password, or its function), a load balancer without backends. The Shard's Ready condition and
placement are not affected: the admin endpoint is fine, and the cause is in front of the shard.

The condition is written from the first failure on and stays, False, once none waits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from domain.conditions import get_condition, object_conditions
from domain.constants import DatabaseConditionType, DatabaseReason, Phase, ShardConditionType, ShardReason
from domain.objects import ShardState

NONE_WAITING = "no new database placed here waits on a failed login at the client endpoint"


def waits_on_client_login(database: Mapping[str, Any]) -> bool:
    """Whether the Database is Provisioning because its Ready login failed."""
    if (database.get("status") or {}).get("phase") != Phase.PROVISIONING:
        return False
    ready = get_condition(object_conditions(database), DatabaseConditionType.READY)
    return ready is not None and ready.get("reason") == DatabaseReason.LOGIN_FAILED


def report_client_logins(shard: ShardState, databases: Iterable[Mapping[str, Any]]) -> ShardState:
    """`shard` with ClientLoginFailing set from the Databases placed on it."""
    waiting = [db for db in databases if waits_on_client_login(db)]
    if waiting:
        ready = get_condition(object_conditions(waiting[0]), DatabaseConditionType.READY) or {}
        message = (
            f"{len(waiting)} new database(s) placed here did not log in at the client endpoint and stay "
            f"Provisioning (reason LoginFailed), e.g. {ready.get('message', '')}"
        )
        return shard.with_condition(ShardConditionType.CLIENT_LOGIN_FAILING, True, ShardReason.LOGIN_FAILED, message)
    if not any(c.type == ShardConditionType.CLIENT_LOGIN_FAILING for c in shard.status.conditions):
        return shard
    return shard.with_condition(ShardConditionType.CLIENT_LOGIN_FAILING, False, ShardReason.OK, NONE_WAITING)
