"""Wires the Consumer controller: a pass when a Consumer changes (not on the echo of its own status write)
and when the count of its databases does (paced: reconciler.counts)."""

from __future__ import annotations

from domain.quota import counts_against_quota
from domain.resources import database_consumer
from informers import Informer, Rest
from reconciler.consumer.controller import ConsumerController
from reconciler.counts import coalesced_counts
from reconciler.runtime import Controller, ControllerManager, Wakeups


def setup_consumers(
    manager: ControllerManager, rest: Rest, consumers: Informer, databases: Informer
) -> ConsumerController:
    """The Consumer controller on `manager`."""
    wakeups = Wakeups()
    logic = ConsumerController(rest, consumers, databases, wakeups)
    controller = Controller("consumer", logic.reconcile, workers=1, wakeups=wakeups)
    controller.watch(consumers, echo=logic.echoes.echo)
    databases.add_handler(coalesced_counts(controller, database_consumer, counts_against_quota), replay=False)
    manager.add_controller(controller)
    return logic
