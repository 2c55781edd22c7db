"""The OpenAPI document against the live API over TLS: documented responses, and schemathesis fuzzing.

1. A curated walk through every route and every status code (201, 200, 202, 400s, 401, 404, 409, 413,
   415, 429, 503) validates each live response against the document (status documented, body schema,
   required headers).
2. schemathesis generates requests from the document (valid and invalid ones) and sends them with a
   valid token: no 5xx (503 credentials_unavailable excepted), no undocumented status, content type,
   header or body.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

import pytest
import requests
import yaml

from api.app import OPENAPI_PATH
from tests.api.support import ApiEnv, Consumer

if TYPE_CHECKING:
    import schemathesis

# schemathesis and hypothesis are imported by the tests that use them, not at collection: every test here
# needs the live API (a server), and importing them cost each `make test-fast` worker a second for nothing.


@pytest.fixture(scope="module")
def document(env: ApiEnv) -> schemathesis.BaseSchema:
    import schemathesis

    return schemathesis.openapi.from_url(f"{env.base_url}/openapi.json", verify=str(env.ca_file), timeout=30)


def validate(document: schemathesis.BaseSchema, template: str, response: requests.Response) -> None:
    method = response.request.method
    assert method is not None
    operation = document[template][method]
    documented = {str(code) for code in operation.definition.raw["responses"]}
    assert str(response.status_code) in documented, f"{method} {template}: undocumented {response.status_code}"
    operation.validate_response(response)


def test_every_route_and_status_validates(env: ApiEnv, document: schemathesis.BaseSchema) -> None:
    consumer = env.ready_consumer(max_databases=2)
    token = consumer.token
    one = "/v1/databases/{externalId}"
    creds = one + "/credentials"
    rotate = creds + "/rotate"
    seen: set[tuple[str, int]] = set()

    def check(template: str, method: str, url: str, expected: int, **kwargs: object) -> requests.Response:
        response = env.call(method, url, kwargs.pop("token", token), **kwargs)  # type: ignore[arg-type]
        assert response.status_code == expected, (method, url, response.status_code, response.text)
        validate(document, template, response)
        seen.add((f"{method} {template}", expected))
        return response

    check("/v1/databases", "GET", "/v1/databases", 200)
    check("/v1/databases", "GET", "/v1/databases", 401, token=None)
    check(one, "PUT", "/v1/databases/walk", 201, json={"sizeClass": "small"})
    check(one, "PUT", "/v1/databases/walk", 200)
    check(one, "PUT", "/v1/databases/Bad_Id", 400)
    check(one, "PUT", "/v1/databases/walk2", 400, json={"sizeClass": "huge"})
    check(one, "PUT", "/v1/databases/walk2", 400, data=b"[1]", headers={"Content-Type": "application/json"})
    padded = b"{" + b" " * 20000 + b"}"
    check(one, "PUT", "/v1/databases/walk2", 413, data=padded, headers={"Content-Type": "application/json"})
    check(one, "PUT", "/v1/databases/walk2", 415, data=b"x", headers={"Content-Type": "text/plain"})
    check(one, "PUT", "/v1/databases/walk2", 201)
    check(one, "PUT", "/v1/databases/walk3", 429)
    listed = check("/v1/databases", "GET", "/v1/databases", 200)
    check("/v1/databases", "GET", "/v1/databases", 304, headers={"If-None-Match": listed.headers["ETag"]})
    check(one, "GET", "/v1/databases/walk", 200)
    check(one, "GET", "/v1/databases/missing", 404)
    check(one, "GET", "/v1/databases/Bad_Id", 400)
    check(creds, "GET", "/v1/databases/walk/credentials", 409)
    check(rotate, "POST", "/v1/databases/walk/credentials/rotate", 409)
    check(creds, "GET", "/v1/databases/missing/credentials", 404)
    db = env.make_ready(consumer.name, "walk")
    check(creds, "GET", "/v1/databases/walk/credentials", 503)  # no Secret yet
    env.credentials_secret(db)
    check(creds, "GET", "/v1/databases/walk/credentials", 200)
    check(rotate, "POST", "/v1/databases/walk/credentials/rotate", 202)
    check(rotate, "POST", "/v1/databases/missing/credentials/rotate", 404)
    check(one, "DELETE", "/v1/databases/walk", 202)
    check(one, "DELETE", "/v1/databases/walk", 202)
    check(one, "DELETE", "/v1/databases/missing", 404)
    check(one, "PUT", "/v1/databases/walk", 409)
    undelete = one + "/undelete"
    check(undelete, "POST", "/v1/databases/walk/undelete", 403)  # the default install does not allow it
    check(undelete, "POST", "/v1/databases/Bad_Id/undelete", 400)
    check("/healthz", "GET", "/healthz", 200, token=None)
    check("/readyz", "GET", "/readyz", 200, token=None)
    check("/openapi.json", "GET", "/openapi.json", 200, token=None)
    check("/openapi.yaml", "GET", "/openapi.yaml", 200, token=None)
    assert len(seen) >= 25


# -- schemathesis -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_consumer(env: ApiEnv) -> Iterator[Consumer]:
    """The consumer schemathesis calls as, with Ready databases: working credentials, a bad host, one to delete.

    Positive cases also run against these, so 200 / 202 / 409 / 503 answers are fuzzed too.
    """
    consumer = env.ready_consumer(max_databases=25)
    for external_id, host in (
        ("fuzz-ready", "pg.shard01.example"),
        ("fuzz-badhost", "bad_host"),
        ("fuzz-doomed", "pg.shard01.example"),
    ):
        assert env.call("PUT", f"/v1/databases/{external_id}", consumer.token).status_code == 201
        db = env.make_ready(consumer.name, external_id)
        env.credentials_secret(db, values={"host": host})
    yield consumer


def not_a_server_error_except_credentials(
    ctx: object, response: schemathesis.Response, case: schemathesis.Case
) -> None:
    """No 5xx, except the documented 503 credentials_unavailable."""
    if response.status_code < 500:
        return
    if response.status_code == 503:
        try:
            if json.loads(response.content).get("error") == "credentials_unavailable":
                return
        except ValueError:
            pass
    raise AssertionError(f"server error {response.status_code} for {case.method} {case.formatted_path}")


# The operations come from the file in the repository (the served document equals it, see test_server), in
# its order, as (method, path): what schemathesis' get_all_operations() yields for it (checked below).
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
OPERATIONS = [
    (method, path)
    for path, item in yaml.safe_load(OPENAPI_PATH.read_text())["paths"].items()
    for method in item
    if method in HTTP_METHODS
]
UNAUTHENTICATED = {"/healthz", "/readyz", "/openapi.json", "/openapi.yaml"}
POSITIVE, NEGATIVE = "positive", "negative"  # schemathesis.GenerationMode's values


@cache
def file_document() -> schemathesis.BaseSchema:
    import schemathesis

    return schemathesis.openapi.from_path(OPENAPI_PATH)


def checks() -> list[Callable[..., Any]]:
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    return [
        not_a_server_error_except_credentials,
        status_code_conformance,
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        negative_data_rejection,
    ]


# Negative data needs something to make invalid: the unauthenticated, parameterless routes have nothing.
FUZZ_CASES = [
    pytest.param((method, path), mode, id=f"{method.upper()} {path}-{mode}")
    for method, path in OPERATIONS
    for mode in (POSITIVE, NEGATIVE)
    if not (mode == NEGATIVE and path in UNAUTHENTICATED)
]


def test_the_fuzzed_operations_are_the_ones_schemathesis_reads() -> None:
    assert [(op.ok().method, op.ok().path) for op in file_document().get_all_operations()] == OPERATIONS


@pytest.mark.parametrize(("route", "mode"), FUZZ_CASES)
def test_schemathesis_finds_no_errors(env: ApiEnv, fuzz_consumer: Consumer, route: tuple[str, str], mode: str) -> None:
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode

    method, path = route
    operation = file_document()[path][method]
    generation_mode = GenerationMode(mode)
    has_external_id = "{externalId}" in operation.path
    targets: list[str | None] = [None]
    if has_external_id and generation_mode is GenerationMode.POSITIVE:
        # DELETE gets a database of its own: a delete request would make the others not_ready.
        targets += ["fuzz-doomed"] if operation.method.upper() == "DELETE" else ["fuzz-ready", "fuzz-badhost"]
    statuses: list[int] = []
    for target in targets:
        strategy = operation.as_strategy(
            generation_mode=generation_mode, path_parameters={"externalId": target} if target else None
        )

        @given(case=strategy)
        @settings(
            max_examples=50,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case: schemathesis.Case) -> None:
            response = case.call(
                base_url=env.base_url,
                headers={"Authorization": f"Bearer {fuzz_consumer.token}"},
                verify=str(env.ca_file),
                timeout=30,
            )
            statuses.append(response.status_code)
            case.validate_response(response, checks=checks())

        run()
    assert len(statuses) >= (10 if has_external_id else 1)  # the generator really ran
