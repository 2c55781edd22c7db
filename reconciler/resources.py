"""The API resources the controllers read and write, and the cache indexes they share with the API.

Written once in domain.resources; re-exported here for the controllers' imports.
"""

from __future__ import annotations

from domain.resources import *  # noqa: F403 - a re-export: the names are domain.resources.__all__
