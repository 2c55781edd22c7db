"""Shared test vectors for whole landscape objects: Shards, Consumers, Databases and Secrets.

One plain list of `(object, expected_valid, why)`. `tests/cli/test_lint_agrees_with_apiserver.py` runs
every entry through `dbprovider lint` and through the real apiserver (server-side apply, dry run) and
requires all three verdicts to match, so lint's offline rules are proven to be the CRDs' (schema, CEL)
and the apiserver's own (names, Secret keys). Every Shard host of `hosts.HOST_VECTORS` is included.
Keep it plain data (objects are dicts as they would stand in YAML) plus `with_changes`, the one
helper the spec tests share for variations of a valid object. `NAMESPACE` is the release namespace
of the test (namespaced objects live there).
"""

from __future__ import annotations

import copy
from typing import Any

from domain.constants import API_VERSION
from tests.vectors.hosts import HOST_VECTORS

NAMESPACE = "clitest-system"

SHARD_SPEC: dict[str, Any] = {
    "maxDatabases": 200,
    "perconaCluster": {"namespace": "databases", "name": "pg-shard01"},
    "admin": {
        "serviceName": "pg-shard01-primary",
        "secretRef": {"namespace": NAMESPACE, "name": "pg-shard01-provisioner"},
    },
    "client": {"host": "192.0.2.200"},
}
CLOUDBERRY_SPEC: dict[str, Any] = {
    "engine": "cloudberry",
    "maxDatabases": 20,
    "keldonCluster": {"namespace": "analytics", "name": "cluster-demo"},
    "admin": {"secretRef": {"namespace": NAMESPACE, "name": "pg-shard01-provisioner"}},
    "client": {"host": "cb.example.com", "port": 6432},
}
_CONSUMER_SPEC: dict[str, Any] = {
    "tokenSecretRef": {"namespace": NAMESPACE, "name": "clitest-token", "key": "sha256"},
    "maxDatabases": 5,
}
_DATABASE_SPEC: dict[str, Any] = {"consumer": "clitest-consumer", "externalId": "orders"}


def with_changes(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of `base` with `a__b=value` setting base[a][b] (value None deletes the key)."""
    data = copy.deepcopy(base)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def shard(name: str = "vec-shard", base: dict[str, Any] = SHARD_SPEC, **changes: Any) -> dict[str, Any]:
    """A valid postgres Shard (the documented example; `base=CLOUDBERRY_SPEC` for a cloudberry one), with
    `a__b=value` changes (None deletes the key)."""
    spec = with_changes(base, **changes)
    return {"apiVersion": API_VERSION, "kind": "Shard", "metadata": {"name": name}, "spec": spec}


def consumer(name: str = "vec-consumer", **changes: Any) -> dict[str, Any]:
    spec = with_changes(_CONSUMER_SPEC, **changes)
    return {"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": name}, "spec": spec}


def database(name: str = "orders.vec", **changes: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": NAMESPACE}
    spec = with_changes(_DATABASE_SPEC, **changes)
    return {"apiVersion": API_VERSION, "kind": "Database", "metadata": meta, "spec": spec}


def secret(name: str = "vec-token", **sections: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NAMESPACE}}
    return {**body, **sections}


_HASH = "ab" * 32
# A self-signed CA certificate (public; its key was thrown away).
CA_PEM = """-----BEGIN CERTIFICATE-----
MIIBOjCB4qADAgECAgEBMAoGCCqGSM49BAMCMBwxGjAYBgNVBAMMEXZlY3RvcnMg
Y2xpZW50IENBMCAXDTI2MDEwMTAwMDAwMFoYDzIxMjUxMjA4MDAwMDAwWjAcMRow
GAYDVQQDDBF2ZWN0b3JzIGNsaWVudCBDQTBZMBMGByqGSM49AgEGCCqGSM49AwEH
A0IABClz9R5X6jE/A6o0POwhvA3EgXhOqokIo9h9XHnkP8nRHe7v4YBK98AnuxXd
LbJVz5DhpWHVh+w3/9OA8LncLPKjEzARMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZI
zj0EAwIDRwAwRAIgOQXwRzVOPksN+3jW9fyeT7Sklk3wKtkn0qKzhAfT6BICIH6Q
f2mYAGDrp4NKz9zeZEN/XKC0M5s87m/fYB9L9BBO
-----END CERTIFICATE-----
"""
KEY_PEM = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n"

OBJECT_VECTORS: list[tuple[dict[str, Any], bool, str]] = [
    # --- Shards: names ---
    (shard(), True, "the documented example"),
    (shard("shard.eu-1.db"), True, "an object name may contain dots"),
    (shard("Shard01"), False, "uppercase name"),
    (shard("shard_01"), False, "underscore in the name"),
    (shard("-shard"), False, "name starts with a hyphen"),
    (shard("a" * 254), False, "name of 254 characters"),
    (shard("a" * 253), True, "name of 253 characters"),
    # --- Shards: fields and the CEL rules ---
    (shard(base=CLOUDBERRY_SPEC), True, "a cloudberry shard without an admin Service"),
    (shard(maxDatabases=0), False, "maxDatabases below 1"),
    (shard(maxDatabases=-3), False, "negative maxDatabases"),
    (shard(maxDatabases="5"), False, "maxDatabases as a string"),
    (shard(maxDatabases=5.5), False, "maxDatabases as a fraction"),
    (shard(maxDatabases=None), False, "maxDatabases missing"),
    (shard(engine="mysql"), False, "unknown engine"),
    (shard(engine="Postgres"), False, "engine is case-sensitive"),
    (shard(keldonCluster={"namespace": "a", "name": "b"}), False, "postgres shard with a keldonCluster"),
    (shard(perconaCluster=None), False, "postgres shard without perconaCluster"),
    (shard(admin__serviceName=None), False, "postgres shard without an admin Service"),
    (shard(base=CLOUDBERRY_SPEC, keldonCluster=None), False, "cloudberry shard without keldonCluster"),
    (
        shard(base=CLOUDBERRY_SPEC, perconaCluster={"namespace": "a", "name": "b"}),
        False,
        "cloudberry shard with a perconaCluster",
    ),
    (shard(admin__serviceName="1primary"), False, "a Service name must start with a letter"),
    (shard(admin__serviceName="Primary"), False, "uppercase Service name"),
    (shard(admin__port=0), False, "admin port 0"),
    (shard(admin__port=65536), False, "admin port above 65535"),
    (shard(admin__port=6432), True, "another admin port"),
    (shard(admin__sslmode="required"), False, "sslmode spelled wrong"),
    (shard(client__sslmode="verify-full"), True, "sslmode verify-full"),
    (shard(client__sslmode="verify-full", client__caCert=CA_PEM), True, "verify-full with the client CA"),
    (shard(client__caCert=CA_PEM + CA_PEM), True, "a client CA bundle of two certificates"),
    (shard(client__caCert=CA_PEM + KEY_PEM), False, "a private key next to the client CA"),
    (shard(client__caCert="ca.crt"), False, "a file name instead of the client CA's PEM"),
    (shard(client__caCert=""), False, "an empty client CA"),
    (shard(client__port="5432"), False, "port as a string"),
    (shard(admin__secretRef__namespace="Databases"), False, "uppercase namespace in secretRef"),
    (shard(admin__secretRef__namespace="a" * 64), False, "namespace of 64 characters"),
    (shard(admin__secretRef__userKey="user.name"), True, "a Secret key with a dot"),
    (shard(admin__secretRef__userKey="user/name"), False, "a Secret key with a slash"),
    (shard(admin__secretRef=None), False, "admin secretRef missing"),
    (shard(perconaCluster__name="pg_shard"), False, "cluster name with an underscore"),
    (shard(client=None), False, "client endpoint missing"),
    (shard(accepting="no"), False, "accepting as a string"),
    (shard(accepting=False), True, "a draining shard"),
    # --- Consumers ---
    (consumer(), True, "the documented example"),
    (consumer(maxDatabases=None), True, "no quota: allowed by the CRD (lint only warns)"),
    (consumer(maxDatabases=0), True, "quota 0"),
    (consumer(maxDatabases=-1), False, "negative quota"),
    (consumer(maxDatabases="10"), False, "quota as a string"),
    (consumer(tokenSecretRef=None), False, "tokenSecretRef missing"),
    (consumer(tokenSecretRef__key=None), True, "the key defaults to sha256"),
    (consumer(tokenSecretRef__key="sha 256"), False, "a Secret key with a space"),
    (consumer(tokenSecretRef__name="Team-Token"), False, "uppercase Secret name"),
    (consumer(tokenSecretRef__namespace="team_ns"), False, "underscore in the namespace"),
    (consumer(disabled=True), True, "a disabled consumer"),
    (consumer(disabled="true"), False, "disabled as a string"),
    (consumer("Consumer-A"), False, "uppercase consumer name"),
    (consumer("team-a.eu"), True, "a consumer name with a dot"),
    # --- Databases (created by the API, but lint reads them too) ---
    (database(), True, "a database as the API creates it"),
    (database(externalId="Orders"), False, "uppercase externalId"),
    (database(externalId="a" * 64), False, "externalId of 64 characters"),
    (database(externalId="orders.eu"), False, "an externalId is a label, no dots"),
    (database(engine="oracle"), False, "unknown engine"),
    (database(sizeClass="s" * 64), False, "size class of 64 characters"),
    (database(consumer=None), False, "consumer missing"),
    # --- Secrets ---
    (secret(stringData={"sha256": f"{_HASH}\n"}), True, "a hash Secret as consumer new writes it"),
    (secret(data={"sha256": "YWJj"}), True, "base64 data"),
    (secret(data={"sha256": "not base64!"}), False, "data that is not base64"),
    (secret(stringData={"sha/256": _HASH}), False, "a key with a slash"),
    (secret(stringData={"sha256": 5}), False, "stringData value that is not a string"),
    (secret("Team-Token", stringData={"sha256": _HASH}), False, "uppercase Secret name"),
]

# Every host vector as a Shard's client.host (names must stay unique: they become file names).
OBJECT_VECTORS += [
    (shard(f"vec-host-{index}", client__host=host), valid, f"client.host {host!r}: {why}")
    for index, (host, valid, why) in enumerate(HOST_VECTORS)
]
