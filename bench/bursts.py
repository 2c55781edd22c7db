"""What the burst benchmarks (bench/provisioning.py, bench/fleet.py) share: a manager started and
caught up before the first burst, and a burst's cost, measured the same way in both.

    manager, watch = start_manager(stack, rest, shards, "fleet-manager")
    with BurstCost(stack, manager, meter, spy_out) as cost:
        ...                                   # PUTs, then wait for Ready
        cpu, busy = cost.cpu()                # read when the burst is over
    cost.requests(), cost.passes()            # apiserver requests and Database reconciles since its start
    cost.passes("shard")                      # the same for the Shard (or Consumer) controller
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import (
    ApiserverRequests,
    CpuMeter,
    CpuSpent,
    ManagerProcess,
    PySpy,
    ReadyWatch,
    Stack,
    shards_ready,
    wait_for,
)
from informers import Rest

CONTROLLERS = ("database", "shard", "consumer")  # the manager's controllers, as dbprovider_reconciles_total names them


def start_manager(stack: Stack, rest: Rest, shards: list[str], name: str) -> tuple[ManagerProcess, ReadyWatch]:
    """A manager holding the Lease with every one of `shards` Ready, and a ReadyWatch on the
    Databases; then 2 s for the start-up writes to settle before anything is counted."""
    manager = ManagerProcess(stack, name)
    try:
        manager.wait_leading(rest)
        wait_for(lambda: shards_ready(rest, shards), 120, f"{len(shards)} Shard(s) Ready", 0.3)
        watch = ReadyWatch(stack, stack.dev.namespace).start()
    except BaseException:
        manager.stop()
        raise
    time.sleep(2.0)
    return manager, watch


class BurstCost:
    """What a burst costs from the start of the with-block: CPU by component and machine busy
    (`meter`), apiserver requests and Database reconciles, each read when the benchmark asks (the
    CPU when the last database is Ready, the requests once the writes that follow have landed).
    With `spy_out`, py-spy records the manager during the block (`idle`: blocked threads too)."""

    def __init__(
        self, stack: Stack, manager: ManagerProcess, meter: CpuMeter, spy_out: Path | None = None, idle: bool = False
    ) -> None:
        self.stack = stack
        self.manager = manager
        self.meter = meter
        self.spy = PySpy(manager.pid, spy_out, idle=idle) if spy_out is not None else None

    def __enter__(self) -> BurstCost:
        if self.spy is not None:
            self.spy.start()
        self._requests = self.stack.apiserver_requests()
        self._passes = {c: self.manager.reconciles(c) for c in CONTROLLERS}
        self._cpu = CpuSpent(self.meter)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.spy is not None:
            self.spy.stop()

    def cpu(self) -> tuple[dict[str, float], float]:
        """CPU seconds by component and the seconds the machine was busy, so far."""
        return self._cpu.read()

    def requests(self) -> ApiserverRequests:
        return self.stack.apiserver_requests().since(self._requests)

    def passes(self, controller: str = "database") -> float:
        """`controller`'s reconciles so far (Database by default)."""
        return self.manager.reconciles(controller) - self._passes[controller]
