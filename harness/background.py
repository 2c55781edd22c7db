"""A loop on a thread of its own while a test or a benchmark does something else.

Samplers (the peak of a metric, of sessions on a server) and pollers (an API client calling all
the time) of tests and benchmarks are each a daemon thread looping until told to stop, then
joined. `Background` is that thread's lifecycle once; a subclass says what one loop does.
"""

from __future__ import annotations

import threading
from typing import Self


class Background:
    """Runs `run()` on a daemon thread from `start()` (or the with-block's start) to `stop()` (or its
    end); `run()` loops until `stopping` is set, waiting on it between rounds so a stop is prompt."""

    join_timeout = 10.0  # seconds `stop()` waits for the last round to end

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self.run, name=type(self).__name__, daemon=True)

    def run(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(self.join_timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
