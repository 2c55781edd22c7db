"""The resync fast path: a Ready database whose pass would change nothing, recognised on the cached dicts.

A start (and a resync) passes over every Database. The full pass parses metadata, spec and status with
pydantic, classifies the credentials Secret, rebuilds the status and compares it with the stored one:
about 100 us of one core per database, 10 s at 100,000, with the GIL held.
`settled()` answers from the cached objects, without parsing them, whether that pass would take the Ready
path and find nothing to do: no rotation, resize or pending password, every condition it sets already set
as it would set it, the Secret ours, naming the tenant, with a password, and pointing at the shard's client
endpoint. It mirrors `DatabaseController._reconcile` and `ReadyPath.converge` step by step (the comments
name the step); any value it does not expect (a missing key, another type) means "not settled", and the
full pass decides as always. So it only skips work the full pass would find to be none: no SQL, no write,
no Event either way.

What it does not repeat is the pydantic validation of a Ready database that does not change: the CRD's
schema is generated from the same models, so the apiserver stores no object they would refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain.config import InstallConfig, UnknownSizeClass
from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    ANNOTATION_ROTATE_REQUESTED_AT,
    FINALIZER_TENANT,
    DatabaseConditionType,
    DatabaseReason,
    Phase,
)
from domain.credentials import Endpoint, password_id, secret_settled
from domain.specs import DatabaseSpec
from domain.status import DatabaseStatus
from reconciler.database.ready import READY_MESSAGE

_TRUE = "True"


def _key(model: type[DatabaseSpec] | type[DatabaseStatus], field: str) -> str:
    return model.model_fields[field].alias or field


_SIZE_CLASS = _key(DatabaseSpec, "size_class")
_PHASE = _key(DatabaseStatus, "phase")
_TENANT = _key(DatabaseStatus, "tenant_name")
_OBSERVED = _key(DatabaseStatus, "observed_generation")
_APPLIED_CLASS = _key(DatabaseStatus, "applied_size_class")
_APPLIED_LIMIT = _key(DatabaseStatus, "applied_connection_limit")
_DROP_AFTER = _key(DatabaseStatus, "drop_after")
_PASSWORD_APPLIED = _key(DatabaseStatus, "password_applied")
_ROTATION_APPLIED = _key(DatabaseStatus, "rotation_applied")
_LOGIN_ROLE = _key(DatabaseStatus, "login_role")
_RETIRE_LOGIN_AT = _key(DatabaseStatus, "retire_login_at")
_CONDITIONS = _key(DatabaseStatus, "conditions")
# Conditions whose presence the Ready pass would change (remove), or that send the pass elsewhere. The enums'
# values as plain strings: looked up 8 times a key, 100,000 keys at a start.
_ABSENT = (DatabaseConditionType.DELETION_HELD.value, DatabaseConditionType.CONNECTION_LIMIT_DRIFT.value)
_NOT_TRUE = (DatabaseConditionType.TENANT_DROPPED.value, DatabaseConditionType.TENANT_DISABLED.value)
_READY = DatabaseConditionType.READY.value
_OWNERSHIP = DatabaseConditionType.OWNERSHIP_RECORDED.value
_PROVISIONED = DatabaseReason.PROVISIONED.value
_READY_PHASE = Phase.READY.value


def settled(
    db: Mapping[str, Any], endpoint: Endpoint | None, secret: Mapping[str, Any] | None, config: InstallConfig
) -> bool:
    """True when the full pass over `db` (cached, as `caught_up` returned it) would run no SQL and write
    nothing. `endpoint`: the client endpoint of the Shard its status names (None: no such Shard, or its spec
    does not parse); `secret`: its credentials Secret from the cache (None if not there)."""
    if endpoint is None or secret is None:
        return False  # the full pass reports the missing shard, or creates the Secret
    meta, spec, status = db.get("metadata"), db.get("spec"), db.get("status")
    if not (isinstance(meta, Mapping) and isinstance(spec, Mapping) and isinstance(status, Mapping)):
        return False
    generation, annotations = meta.get("generation"), meta.get("annotations") or {}
    if type(generation) is not int or not isinstance(annotations, Mapping):
        return False
    # The finalizer is there, no Kubernetes delete, no delete request: neither held nor soft-deleted.
    finalizers = meta.get("finalizers") or ()
    if meta.get("deletionTimestamp") or FINALIZER_TENANT not in finalizers:
        return False
    if ANNOTATION_DELETE_REQUESTED_AT in annotations:
        return False
    # Ready and placed, not (being) deleted: the Ready path, not recovery, placement or provisioning.
    tenant = status.get(_TENANT)
    if status.get(_PHASE) != _READY_PHASE or status.get(_DROP_AFTER) is not None:
        return False
    if not isinstance(tenant, str) or not tenant:
        return False
    # ReadyWork: no rotation requested, no resize, no pending password.
    rotation = annotations.get(ANNOTATION_ROTATE_REQUESTED_AT)
    if rotation is not None and rotation != status.get(_ROTATION_APPLIED):
        return False
    if status.get(_RETIRE_LOGIN_AT) is not None:
        return False  # an overlap runs: its pass retires the previous login role when it ends
    size_class = spec.get(_SIZE_CLASS, "")
    if not isinstance(size_class, str) or size_class != (status.get(_APPLIED_CLASS) or ""):
        return False
    current_password = password_id(secret)
    if current_password is not None and current_password != status.get(_PASSWORD_APPLIED):
        return False
    # converge: observedGeneration set to the generation; set_drift finds no drift.
    if status.get(_OBSERVED) != generation:
        return False
    applied_limit = status.get(_APPLIED_LIMIT)
    try:
        wanted_limit = config.resolve_connection_limit(size_class)
    except UnknownSizeClass:
        return False  # reported as drift
    if applied_limit is not None and applied_limit != wanted_limit:
        return False
    if not _conditions_settled(status.get(_CONDITIONS), generation):
        return False
    # CredentialsSecrets.ensure: ours, consistent, its endpoint keys those of the shard's client block.
    uid = meta.get("uid")
    login = status.get(_LOGIN_ROLE)
    return isinstance(uid, str) and secret_settled(
        secret, uid, tenant, endpoint, login if isinstance(login, str) else None
    )


def _conditions_settled(conditions: object, generation: int) -> bool:
    """Ready as `report.ready(True, Provisioned, READY_MESSAGE)` sets it for this generation, ownership recorded
    (`OwnershipConfirmation.confirm` asks nothing), and nothing the pass would remove or act on."""
    if not isinstance(conditions, list):
        return False
    found: dict[str, Mapping[str, Any]] = {}
    for condition in conditions:
        if not isinstance(condition, Mapping):
            return False
        found[str(condition.get("type"))] = condition
    ready = found.get(_READY)
    if ready is None or ready.get("status") != _TRUE or ready.get("observedGeneration") != generation:
        return False
    if ready.get("reason") != _PROVISIONED or ready.get("message") != READY_MESSAGE:
        return False
    ownership = found.get(_OWNERSHIP)
    if ownership is None or ownership.get("status") != _TRUE:
        return False
    if any(kind in found for kind in _ABSENT):
        return False
    return not any((found.get(kind) or {}).get("status") == _TRUE for kind in _NOT_TRUE)
