"""Controller machinery shared by the Shard and Database controllers: work queue, controller
workers, leader election, status helpers, metrics and the manager. Knows no concrete controller.
"""

from informers.leader import LeaderElector
from reconciler.runtime.controller import (
    Controller,
    ControllerStopping,
    ReconcileError,
    Result,
    TerminalError,
    Wakeups,
    current_slot,
    ensure_active,
    holding_slot,
    is_conflict,
    release_slot,
)
from reconciler.runtime.manager import ControllerManager
from reconciler.runtime.metrics import MetricsServer, RuntimeMetrics, start_metrics_server
from reconciler.runtime.status import (
    StatusEchoes,
    merge_patch,
    patch_status,
    update_status,
    write_status,
)
from reconciler.runtime.workqueue import ExponentialBackoff, Lanes, Slot, WorkQueue

__all__ = [
    "Controller",
    "ControllerManager",
    "ControllerStopping",
    "ExponentialBackoff",
    "Lanes",
    "LeaderElector",
    "MetricsServer",
    "ReconcileError",
    "Result",
    "RuntimeMetrics",
    "Slot",
    "StatusEchoes",
    "TerminalError",
    "Wakeups",
    "WorkQueue",
    "current_slot",
    "ensure_active",
    "holding_slot",
    "is_conflict",
    "merge_patch",
    "patch_status",
    "release_slot",
    "start_metrics_server",
    "update_status",
    "write_status",
]
