"""The Database controller, one module per part (see controller.py for the order of a pass)."""

from reconciler.database.controller import DatabaseController
from reconciler.database.state import Database

__all__ = ["DatabaseController", "Database"]
