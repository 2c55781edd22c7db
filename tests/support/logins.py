"""Whether a Database's credentials really log in (the fault and upgrade suites' invariant)."""

from __future__ import annotations

from collections.abc import Mapping

import psycopg

from api.models import Credentials


def logs_in(credentials: Mapping[str, str]) -> str | None:
    """None if the credentials log in to their database as their user, through the URI the API hands out;
    else why not (an error class)."""
    login = Credentials.of_secret(credentials)
    try:
        with psycopg.connect(login.uri(), connect_timeout=5) as conn:
            if conn.execute("SELECT current_user").fetchone()[0] != login.user:
                return "logged in as someone else"
    except psycopg.Error as exc:
        return type(exc).__name__
    return None
