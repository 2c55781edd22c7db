"""Fixtures of the API suite: one API served over TLS on the real apiserver for the whole package.

Every test runs with caplog at DEBUG on the root logger (all threads: the server's workers and the
informers' handlers included) and fails if any token, token hash or password the suite created shows
up in a log record.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.support import ApiEnv, start_env, stop_env


@pytest.fixture(scope="package")
def env(kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiEnv]:
    api_env = start_env(kube, Path(tmp_path_factory.mktemp("apitest")))
    try:
        yield api_env
    finally:
        stop_env(api_env)


def leaked_secrets(text: str, sensitive: set[str]) -> list[str]:
    lowered = text.lower()
    return [value for value in sensitive if value.lower() in lowered]


@pytest.fixture(autouse=True)
def no_secrets_in_logs(request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    yield
    if "env" not in request.fixturenames:
        return
    api_env: ApiEnv = request.getfixturevalue("env")
    texts = [caplog.text]
    for record in caplog.records:
        texts.append(record.getMessage())
        texts.append(repr(getattr(record, "http", "")))
        if record.exc_info:
            texts.append(logging.Formatter().formatException(record.exc_info))
    leaks = leaked_secrets("\n".join(texts), api_env.sensitive)
    assert not leaks, f"{len(leaks)} token(s), hash(es) or password(s) appeared in the logs"
