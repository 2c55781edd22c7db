"""Whether a Database's credentials really log in (the fault and upgrade suites' invariant)."""

from __future__ import annotations

from collections.abc import Mapping

import psycopg


def logs_in(credentials: Mapping[str, str]) -> str | None:
    """None if the credentials log in to their database as their user; else why not (an error class)."""
    try:
        with psycopg.connect(
            host=credentials["host"],
            port=int(credentials["port"]),
            user=credentials["user"],
            password=credentials["password"],
            dbname=credentials["database"],
            sslmode=credentials["sslmode"],
            connect_timeout=5,
        ) as conn:
            if conn.execute("SELECT current_user").fetchone()[0] != credentials["user"]:
                return "logged in as someone else"
    except psycopg.Error as exc:
        return type(exc).__name__
    return None
