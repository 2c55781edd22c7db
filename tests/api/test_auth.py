"""Authentication: every refusal ends in the same bare 401; changes apply without a restart."""

from __future__ import annotations

import logging

import pytest
import requests

from api.auth import AuthState
from domain.resources import CONSUMERS
from informers import SECRETS
from tests.api.support import NAMESPACE, OTHER_NAMESPACE, ApiEnv, new_token, sha256_hex
from tests.support.common import wait_for

LIST = "/v1/databases"


def assert_bare_401(response: requests.Response, reference: requests.Response) -> None:
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.content == reference.content  # byte for byte the same, whatever the cause
    assert response.json() == {"error": "unauthorized", "message": "authentication required"}


@pytest.fixture
def reference(env: ApiEnv) -> requests.Response:
    """The 401 without any Authorization header: every other failure must look exactly like it."""
    response = env.call("GET", LIST)
    assert response.status_code == 401
    return response


def wait_state(env: ApiEnv, consumer: str, state: AuthState) -> None:
    wait_for(lambda: env.components.tokens.state(consumer) is state, what=f"{consumer} in state {state.name}")


def test_valid_token_authenticates(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    response = env.call("GET", LIST, consumer.token)
    assert response.status_code == 200
    assert response.json() == {"items": []}


def test_scheme_is_case_insensitive(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    response = env.call("GET", LIST, headers={"Authorization": f"bearer {consumer.token}"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Token {token}",
        "Bearer {token} extra",
        "Bearer {token},",
        "Bearer\t{token}",
        "{token}",
        "Bearer " + "a" * 5000,
    ],
    ids=[
        "empty",
        "scheme-only",
        "scheme-space",
        "basic",
        "other-scheme",
        "two-tokens",
        "trailing-comma",
        "tab",
        "no-scheme",
        "huge",
    ],
)
def test_malformed_header(env: ApiEnv, reference: requests.Response, header: str) -> None:
    consumer = env.ready_consumer()
    response = env.call("GET", LIST, headers={"Authorization": header.format(token=consumer.token)})
    assert_bare_401(response, reference)


def test_unknown_token(env: ApiEnv, reference: requests.Response) -> None:
    token = new_token()
    env.remember(token, sha256_hex(token))
    assert_bare_401(env.call("GET", LIST, token), reference)


def test_hash_as_token_does_not_authenticate(env: ApiEnv, reference: requests.Response) -> None:
    consumer = env.ready_consumer()
    assert_bare_401(env.call("GET", LIST, sha256_hex(consumer.token)), reference)


def test_disabled_consumer(env: ApiEnv, reference: requests.Response) -> None:
    consumer = env.new_consumer(disabled=True)
    wait_state(env, consumer.name, AuthState.DISABLED)
    assert_bare_401(env.call("GET", LIST, consumer.token), reference)
    # Re-enabled: works without a restart; disabled again: cut off at once.
    env.patch_consumer(consumer.name, {"disabled": False})
    env.wait_status("GET", LIST, consumer.token, 200)
    env.patch_consumer(consumer.name, {"disabled": True})
    env.wait_status("GET", LIST, consumer.token, 401)
    assert_bare_401(env.call("GET", LIST, consumer.token), reference)


def test_ref_outside_release_namespace(
    env: ApiEnv, reference: requests.Response, caplog: pytest.LogCaptureFixture
) -> None:
    # The Secret exists, with the right hash, but in another namespace: never authenticates.
    consumer = env.new_consumer(secret_namespace=OTHER_NAMESPACE)
    wait_state(env, consumer.name, AuthState.FOREIGN_NAMESPACE)
    assert_bare_401(env.call("GET", LIST, consumer.token), reference)

    def warnings() -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING and consumer.name in r.getMessage() and "tokenSecretRef" in r.getMessage()
        ]

    wait_for(lambda: len(warnings()) == 1, what="one warning")
    # Another event of the same generation (a label) logs nothing new ...
    env.admin.patch(CONSUMERS, consumer.name, {"metadata": {"labels": {"touched": "yes"}}})
    env.components.tokens.rebuild()
    assert len(warnings()) == 1
    # ... a new generation logs once more.
    env.patch_consumer(consumer.name, {"maxDatabases": 3})
    wait_for(lambda: len(warnings()) == 2, what="a warning for the new generation")
    assert all(sha256_hex(consumer.token) not in r.getMessage() for r in caplog.records)


def test_missing_secret_then_created(env: ApiEnv, reference: requests.Response) -> None:
    consumer = env.new_consumer(create_secret=False)
    wait_state(env, consumer.name, AuthState.SECRET_MISSING)
    assert_bare_401(env.call("GET", LIST, consumer.token), reference)
    env.hash_secret(consumer.secret_name, [sha256_hex(consumer.token)])
    env.wait_status("GET", LIST, consumer.token, 200)


def test_missing_key(env: ApiEnv, reference: requests.Response) -> None:
    consumer = env.new_consumer(secret_key="other-key")
    wait_state(env, consumer.name, AuthState.KEY_MISSING)
    assert_bare_401(env.call("GET", LIST, consumer.token), reference)


def test_secret_deleted_stops_authentication(env: ApiEnv, reference: requests.Response) -> None:
    consumer = env.ready_consumer()
    env.admin.delete(SECRETS, consumer.secret_name, NAMESPACE)
    env.wait_status("GET", LIST, consumer.token, 401)
    assert_bare_401(env.call("GET", LIST, consumer.token), reference)


def test_consumer_deleted_stops_authentication(env: ApiEnv, reference: requests.Response) -> None:
    consumer = env.ready_consumer()
    env.admin.delete(CONSUMERS, consumer.name)
    env.wait_status("GET", LIST, consumer.token, 401)
    assert_bare_401(env.call("GET", LIST, consumer.token), reference)


def test_duplicate_hash_denies_both(
    env: ApiEnv, reference: requests.Response, caplog: pytest.LogCaptureFixture
) -> None:
    shared = new_token()
    own_a, own_b = new_token(), new_token()
    env.remember(shared, sha256_hex(shared), own_a, sha256_hex(own_a), own_b, sha256_hex(own_b))
    a = env.new_consumer(hash_lines=[sha256_hex(shared), sha256_hex(own_a)])
    b = env.new_consumer(hash_lines=[sha256_hex(shared).upper(), sha256_hex(own_b)])
    env.wait_status("GET", LIST, own_a, 200)
    env.wait_status("GET", LIST, own_b, 200)
    assert_bare_401(env.call("GET", LIST, shared), reference)
    conflict = [r for r in caplog.records if "more than one" in r.getMessage() or "same token hash" in r.getMessage()]
    assert conflict and a.name in conflict[-1].getMessage() and b.name in conflict[-1].getMessage()
    # Resolving the misconfiguration (the hash leaves b) lets a authenticate with it, without a restart.
    env.hash_secret(b.secret_name, [sha256_hex(own_b)])
    env.wait_status("GET", LIST, shared, 200)
    assert env.call("GET", LIST, shared).status_code == 200


def test_uppercase_hash(env: ApiEnv) -> None:
    token = new_token()
    env.remember(token, sha256_hex(token), sha256_hex(token).upper())
    consumer = env.new_consumer(hash_lines=[sha256_hex(token).upper()])
    env.wait_status("GET", LIST, token, 200)
    assert env.components.tokens.state(consumer.name) is AuthState.OK


def test_several_hashes_and_rotation(env: ApiEnv, reference: requests.Response) -> None:
    """Rotation without downtime: add the new hash, switch callers, remove the old hash."""
    consumer = env.ready_consumer()
    new = new_token()
    env.remember(new, sha256_hex(new))
    env.hash_secret(consumer.secret_name, [sha256_hex(consumer.token), sha256_hex(new)])
    env.wait_status("GET", LIST, new, 200)
    assert env.call("GET", LIST, consumer.token).status_code == 200  # both valid during the switch
    env.hash_secret(consumer.secret_name, [sha256_hex(new)])
    env.wait_status("GET", LIST, consumer.token, 401)
    assert_bare_401(env.call("GET", LIST, consumer.token), reference)
    assert env.call("GET", LIST, new).status_code == 200


def test_malformed_lines_are_ignored_and_counted(env: ApiEnv, caplog: pytest.LogCaptureFixture) -> None:
    token = new_token()
    pasted = "this-is-not-a-hash-" + new_token()  # e.g. a token pasted by mistake: never logged
    env.remember(token, sha256_hex(token), pasted)
    consumer = env.new_consumer(hash_lines=["", f"  {sha256_hex(token)}  ", pasted, "zz" * 32, "   "])
    env.wait_status("GET", LIST, token, 200)
    counted = [
        r for r in caplog.records if "ignored 2 line(s)" in r.getMessage() and consumer.secret_name in r.getMessage()
    ]
    assert len(counted) == 1
    env.components.tokens.rebuild()  # re-evaluating the same Secret version does not log again
    assert len([r for r in caplog.records if "ignored 2 line(s)" in r.getMessage()]) == 1


def test_secret_without_any_valid_hash(env: ApiEnv, reference: requests.Response) -> None:
    consumer = env.new_consumer(hash_lines=["not-a-hash"])
    env.remember("not-a-hash")
    wait_state(env, consumer.name, AuthState.NO_HASHES)
    assert_bare_401(env.call("GET", LIST, consumer.token), reference)


@pytest.mark.parametrize("path", ["/v1/databases", "/v1/databases/x1", "/v1/databases/x1/credentials"])
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "POST"])
def test_every_v1_route_requires_auth(env: ApiEnv, reference: requests.Response, method: str, path: str) -> None:
    assert_bare_401(env.call(method, path), reference)


def test_unauthenticated_routes(env: ApiEnv) -> None:
    for path in ("/healthz", "/readyz", "/openapi.json", "/openapi.yaml"):
        assert env.call("GET", path).status_code == 200, path
