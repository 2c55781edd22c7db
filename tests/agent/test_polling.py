"""What the agent costs the provider, and its token: at rest one conditional list per poll and nothing
else; a token changed in its file is used without a restart; a refused token shows on the claims; a
Secret name taken by a foreign Secret is told on the claim and the Secret is left alone."""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

from dbprovider.devstack import DevStack
from domain.constants import DEFAULT_TOKEN_KEY
from domain.credentials import opaque_secret
from domain.tokens import hash_token
from harness import KubeControlPlane
from informers import SECRETS, Rest
from tests.agent.conftest import POLL_SECONDS, Consumer, Provider
from tests.agent.test_agent import no_delete_pending
from tests.support.common import unique, wait_for

UNKNOWN = {"sizeClass": "no-such-class"}


def consumer_requests(provider: Provider, consumer: str) -> list[dict[str, Any]]:
    """The provider's access log lines (api.access: the message is the JSON of the request) of `consumer`."""
    lines = (json.loads(e["message"]) for e in provider.events() if e.get("logger") == "api.access")
    return [line for line in lines if line.get("consumer") == consumer]


def test_at_rest_the_agent_sends_one_conditional_list_per_poll(
    consumer: Consumer, provider: Provider, stack: DevStack
) -> None:
    claim = consumer.claim(unique("rest"))
    consumer.wait_condition(claim, "Ready", "True", timeout=120)
    no_delete_pending(stack)  # a drop is a change
    seen = len(consumer_requests(provider, stack.consumer))
    # Three more polls' worth of requests, whatever they are.
    wait_for(lambda: len(consumer_requests(provider, stack.consumer)) >= seen + 4, 10 * POLL_SECONDS, "polls")
    later = consumer_requests(provider, stack.consumer)[seen + 1 :]  # the first may still be a change's
    assert later and all((r["method"], r["route"], r["status"]) == ("GET", "/v1/databases", 304) for r in later), [
        (r["method"], r["route"], r["status"]) for r in later
    ]


def token_secret_name(stack: DevStack) -> str:
    return f"{stack.consumer}-token"


def set_token_hashes(admin: Rest, stack: DevStack, *tokens: str) -> None:
    lines = "".join(f"{hash_token(token)}\n" for token in tokens)
    encoded = base64.b64encode(lines.encode()).decode()
    admin.patch(SECRETS, token_secret_name(stack), {"data": {DEFAULT_TOKEN_KEY: encoded}}, stack.namespace)


def test_a_new_token_in_the_file_is_used_and_a_refused_one_is_shown(
    consumer: Consumer, stack: DevStack, kube: KubeControlPlane
) -> None:
    new_token = secrets.token_hex(32)
    with kube.admin_client() as client:
        admin = Rest(client)
        set_token_hashes(admin, stack, stack.token, new_token)
        try:
            consumer.token_file.write_text(new_token + "\n")
            set_token_hashes(admin, stack, new_token)  # the old token no longer authenticates
            claim = consumer.claim(unique("token"), UNKNOWN)
            assert consumer.wait_condition(claim, "Ready", "False")["reason"] == "UnknownSizeClass"  # it was asked
            assert consumer.condition(claim, "ProviderReachable")["status"] == "True"

            consumer.token_file.write_text(secrets.token_hex(32) + "\n")  # a token the provider does not know
            refused = consumer.wait_condition(claim, "ProviderReachable", "False", timeout=60)
            assert refused["reason"] == "Unauthorized"
        finally:
            set_token_hashes(admin, stack, stack.token)
            consumer.token_file.write_text(stack.token + "\n")
    consumer.wait_condition(claim, "ProviderReachable", "True", timeout=60)


def test_a_foreign_secret_under_the_name_is_left_alone(consumer: Consumer) -> None:
    namespace = unique("foreign")
    consumer.kube.ensure_namespace(namespace)
    foreign = opaque_secret("app-db", namespace, {"password": "theirs"})
    consumer.admin.create(SECRETS, foreign, namespace)
    claim = consumer.claim(namespace, {"secretName": "app-db"})
    wait_for(lambda: consumer.condition(claim, "Ready").get("reason") == "SecretConflict", 120, "SecretConflict")
    secret = consumer.secret(namespace, "app-db")
    assert secret is not None and base64.b64decode(secret["data"]["password"]) == b"theirs"
    assert set(secret["data"]) == {"password"} and not secret["metadata"].get("ownerReferences")
