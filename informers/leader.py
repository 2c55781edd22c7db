"""Leader election on a coordination.k8s.io/v1 Lease, of our own (not the client's package).

Why not `kubernetes.leaderelection`: it folds API errors into booleans and keeps the worker
running after the lease is lost. Here:
- Every write of the Lease is a PUT carrying the resourceVersion we read: a 409 means another
  replica wrote it first, and we are not (or no longer) the leader, at once. A leader renews
  without reading first, on the resourceVersion of its own last write (client-go's fast path);
  if the Lease changed or went since, it is read and decided on as any replica does.
- Other API errors (403, 5xx, timeouts) are logged with their status and retried every
  `retry_period`; if no renewal succeeded for `renew_deadline`, we stop leading at once
  (`on_stopped_leading` runs before anything else happens). Each request's timeout is bounded
  by the time left until the deadline, in total (connect, TLS, answer), on a client of its own
  that never retries behind our back (`Rest.without_retries`: urllib3 would retry a timed-out PUT
  three times), so a hung or cut-off apiserver cannot keep us leading past the deadline.
- `is_leading()` is also time-based: it turns False as soon as the renew deadline has passed,
  even before the elector thread notices. Controllers consult it before every write.
- A renewal that succeeds after the renew deadline had passed (the apiserver answered late, or
  this process was paused) keeps the lease, which is safe (the write was conditional on the
  resourceVersion we read, so nobody else held it meanwhile), but `is_leading()` said False for
  a while: `on_resumed_leading` runs then, so the caller can redo what it skipped (a full resync).
- Another replica takes a lease only after it has seen no change of it for leaseDurationSeconds
  (measured on its own clock, as client-go does, so clock skew does not matter); with
  lease_duration > renew_deadline the old leader has stopped before anyone else can start.
- `stop()` stops leading (callbacks) and then releases the lease, so another replica takes over on
  its next retry instead of after the lease duration.

Releases side by side (a rolling update, a rollback): the leader marks the Lease with its release
and its real lease duration (annotation `db.bnerd.com/leader`, `LeaderMark`) and writes the much
longer `older_release_wait` into spec.leaseDurationSeconds, the only field an older release reads.
So an older replica never takes the Lease from a newer one that is alive, nor after it crashed,
until `older_release_wait` passed without a renewal; a release by `stop()` is taken at once only by
replicas of the same or a newer release. Replicas of one release wait the real duration, as always.
Why: an older leader after a newer one would rewrite what the newer one wrote (status it does not
know, conditions it judges otherwise), and leadership alternating during a rollout would repeat
that each time. A leader of an older release (unmarked Lease) is waited for by its own duration.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from domain.constants import ANNOTATION_LEADER
from domain.lease import Lease, LeaseSpec
from domain.objects import Obj
from domain.settings import SETTINGS, LeaseTimings
from domain.timefmt import format_micro_time
from domain.version import __version__, parse_version
from informers import LEASES, Rest

log = logging.getLogger(__name__)


def default_identity() -> str:
    """hostname_pid_random: unique per process even with equal hostnames and pid namespaces."""
    return f"{socket.gethostname()}_{os.getpid()}_{secrets.token_hex(4)}"


def _micro_time() -> str:
    return format_micro_time(datetime.now(UTC))


@dataclass(frozen=True)
class LeaderMark:
    """What a leader of this release writes on the Lease beside its spec: who, which release, the
    lease duration it renews within, and whether it released the Lease on shutdown."""

    holder: str
    release: tuple[int, int, int]
    duration: int
    released: bool = False

    def annotation(self) -> str:
        return json.dumps(
            {
                "holder": self.holder,
                "release": ".".join(str(part) for part in self.release),
                "leaseDurationSeconds": self.duration,
                "released": self.released,
            },
            sort_keys=True,
        )

    @classmethod
    def of(cls, lease: Lease | Obj) -> LeaderMark | None:
        """The mark on `lease`; None when there is none or it is malformed (then spec alone counts)."""
        value = _typed(lease).metadata.annotations.get(ANNOTATION_LEADER)
        try:
            data: Any = json.loads(value) if isinstance(value, str) else None
            if not isinstance(data, dict):
                return None
            holder, duration, released = data["holder"], data["leaseDurationSeconds"], data["released"]
            if not isinstance(holder, str) or type(duration) is not int or duration < 1 or type(released) is not bool:
                return None
            return cls(holder, parse_version(data["release"]), duration, released)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def lease_holder(lease: Lease | Obj) -> str | None:
    """Who leads according to `lease`: its holderIdentity, or None when empty or released by its
    holder (a released Lease keeps the holder's name for older releases' sake, see above)."""
    lease = _typed(lease)
    holder = lease.spec.holder_identity or None
    mark = LeaderMark.of(lease)
    if holder is not None and mark is not None and mark.holder == holder and mark.released:
        return None
    return holder


class LeaderElector:
    def __init__(
        self,
        api_client: ApiClient | Rest,
        namespace: str,
        name: str,
        *,
        identity: str | None = None,
        lease_duration: float = SETTINGS.lease.duration,
        renew_deadline: float = SETTINGS.lease.renew_deadline,
        retry_period: float = SETTINGS.lease.retry_period,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_resumed_leading: Callable[[], None] | None = None,
        older_release_wait: float = SETTINGS.lease.older_release_wait,
        release: str = __version__,
        annotations: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        # The other timings (jitter, request bounds) are SETTINGS'; LeaseTimings checks the three.
        self.timings: LeaseTimings = replace(
            SETTINGS.lease,
            duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
            older_release_wait=older_release_wait,
        )
        self.release = parse_version(release)
        shared = api_client if isinstance(api_client, Rest) else Rest(api_client)
        self.rest = shared.without_retries()  # closed when the elector stops
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_resumed_leading = on_resumed_leading
        # Annotations the leader writes with every write of the Lease (at no cost: it renews anyway).
        self.annotations = annotations
        self.resumptions = 0  # late renewals that resumed leading (observability and tests)
        # Monotonic time of the apiserver's last good answer to a lease request (every replica
        # asks every retry_period, leading or not): the replica's "is the apiserver there?" signal.
        self.last_contact = 0.0

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._release_on_stop = True
        self._leading = False
        self._last_renew = 0.0  # monotonic time of our last successful write
        self._observed_spec: LeaseSpec | None = None
        self._observed_mark: LeaderMark | None = None
        self._observed_time = 0.0
        self._lease: Lease | None = None  # last lease object read or written by us
        self._became_leader = threading.Event()
        self.last_error: BaseException | None = None

    def __repr__(self) -> str:
        return f"<LeaderElector {self.namespace}/{self.name} as {self.identity}>"

    # -- public ----------------------------------------------------------------------------------

    def is_leading(self) -> bool:
        """True while we hold the lease and our last renewal is younger than the renew deadline."""
        return self._leading and time.monotonic() < self._last_renew + self.timings.renew_deadline

    def wait_until_leading(self, timeout: float | None = None) -> bool:
        return self._became_leader.wait(timeout) and self.is_leading()

    def start(self) -> LeaderElector:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"leader-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self, release: bool = True, timeout: float | None = None) -> None:
        """Stop campaigning; if leading, run on_stopped_leading, then (if `release`) free the lease.

        Waits for the elector thread (at most `timeout` seconds; None = until it is done, which
        includes on_stopped_leading, i.e. the controllers' in-flight reconciles).
        """
        self._release_on_stop = release
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- loop ------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._attempt(deadline=None):
                    self._lead()
                    if self._stop.is_set():
                        break
                self._stop.wait(self.timings.retry_period * random.uniform(1.0, 1.0 + self.timings.retry_jitter))
        finally:
            self.rest.api_client.close()

    def _attempt(self, deadline: float | None) -> bool:
        """One try to acquire or renew; False if someone else holds it or on an API error."""
        try:
            return self._try_acquire_or_renew(deadline)
        except Exception as exc:  # noqa: BLE001 - logged with its status, retried by the caller
            self.last_error = exc
            status = exc.status if isinstance(exc, ApiException) else type(exc).__name__
            log.warning("%r: lease request failed (%s): %s", self, status, _short(exc))
            return False

    def _lead(self) -> None:
        self._leading = True
        self._became_leader.set()
        log.info("%r: started leading", self)
        if self.on_started_leading is not None:
            # Its own thread (as client-go does): a slow start must not delay the renewals.
            threading.Thread(target=self._call_started, name=f"leader-{self.name}-start", daemon=True).start()
        try:
            self._renew_until_lost()
        finally:
            self._stop_leading()
        if self._stop.is_set() and self._release_on_stop:
            self._release()

    def _call_started(self) -> None:
        try:
            assert self.on_started_leading is not None
            self.on_started_leading()
        except Exception:
            log.exception("%r: on_started_leading failed", self)

    def _renew_until_lost(self) -> None:
        wait = self.timings.retry_period
        while not self._stop.wait(wait):
            deadline = self._last_renew + self.timings.renew_deadline
            if self._attempt(deadline):
                wait = self.timings.retry_period
                if time.monotonic() >= deadline:
                    self._resumed(time.monotonic() - deadline)
                continue
            if self._lease_taken_by_other():
                log.warning("%r: the lease is held by %s now; stopping at once", self, self._holder())
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.error(
                    "%r: no renewal for %.1fs (renew deadline); stopping at once", self, self.timings.renew_deadline
                )
                return
            wait = min(self.timings.retry_period, remaining)  # the last try lands on the deadline

    def _resumed(self, lapse: float) -> None:
        """A late renewal: we lead again after `is_leading()` was False for up to `lapse` seconds."""
        self.resumptions += 1
        log.warning("%r: renewed %.1fs past the renew deadline; leading again", self, lapse)
        if self.on_resumed_leading is not None:
            try:
                self.on_resumed_leading()
            except Exception:  # the lease is ours either way
                log.exception("%r: on_resumed_leading failed", self)

    def _stop_leading(self) -> None:
        self._leading = False
        self._became_leader.clear()
        log.info("%r: stopped leading", self)
        if self.on_stopped_leading is not None:
            try:
                self.on_stopped_leading()
            except Exception:  # must not keep us "leading"
                log.exception("%r: on_stopped_leading failed", self)

    def _holder(self) -> str | None:
        return None if self._observed_spec is None else self._observed_spec.holder_identity

    def _held_by_other(self) -> bool:
        """Another replica holds the lease as last observed, and it has not run out (our clock)."""
        spec = self._observed_spec or LeaseSpec()
        holder = spec.holder_identity
        if not holder or holder == self.identity:
            return False
        return time.monotonic() < self._observed_time + self._holder_duration(holder, spec)

    def _holder_duration(self, holder: str, spec: LeaseSpec) -> float:
        """How long after its last observed change the lease of `holder` counts as held."""
        mark = self._observed_mark
        if mark is None or mark.holder != holder:  # a leader of an older release: its own duration
            return spec.lease_duration_seconds or self.timings.duration
        if mark.release > self.release:  # a newer release's: what older releases are told to wait
            return spec.lease_duration_seconds or self.timings.older_release_wait
        return 0.0 if mark.released else mark.duration

    def _lease_taken_by_other(self) -> bool:
        holder = self._holder()
        return bool(holder) and holder != self.identity

    # -- the lease -------------------------------------------------------------------------------

    def _timeout(self, deadline: float | None) -> float:
        """The whole request's bound (urllib3 `total`: connect, TLS and answer together)."""
        budget = self.timings.renew_deadline if deadline is None else deadline - time.monotonic()
        return max(self.timings.min_request_timeout, min(budget, self.timings.renew_deadline))

    def _observe(self, obj: Obj) -> Lease:
        """Parse a Lease just read or written (once) and note whether it changed since the last one."""
        lease = Lease.parse(obj)
        mark = LeaderMark.of(lease)
        if lease.spec != self._observed_spec or mark != self._observed_mark:
            self._observed_spec = lease.spec
            self._observed_mark = mark
            self._observed_time = time.monotonic()
        self._lease = lease
        return lease

    def _marked(self, lease: Lease, *, released: bool = False) -> Obj:
        """The body writing `lease` with this replica's LeaderMark (other annotations kept)."""
        mark = LeaderMark(self.identity, self.release, self._lease_seconds(), released)
        extra = self.annotations() if self.annotations is not None else {}
        return lease.body({**lease.metadata.annotations, **extra, ANNOTATION_LEADER: mark.annotation()})

    def _try_acquire_or_renew(self, deadline: float | None) -> bool:
        # Our lead is counted from BEFORE the request: the write may commit at any point until the
        # answer arrives, and another replica's wait starts no earlier than that commit.
        started = time.monotonic()
        now = _micro_time()
        if self._leading and (fast := self._renew_own_write(deadline, started, now)) is not None:
            return fast
        try:  # every request's timeout is what is left until the renew deadline
            lease = self.rest.get(LEASES, self.name, self.namespace, timeout=self._timeout(deadline))
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.last_contact = time.monotonic()
            if self._held_by_other():
                # Deleted while another replica held it: that replica may still be leading until
                # its next renewal (which re-creates the Lease). Wait for its lease to run out.
                return False
            return self._create(now, deadline, started)
        self.last_contact = time.monotonic()
        current = self._observe(lease)
        if self._held_by_other():
            return False  # held by another replica and not expired
        renewed = current.with_spec(
            holder_identity=self.identity, lease_duration_seconds=self._advertised_seconds(), renew_time=now
        )
        if current.spec.holder_identity != self.identity or self._released_by_self():
            renewed = renewed.with_spec(acquire_time=now, lease_transitions=(current.spec.lease_transitions or 0) + 1)
        body = self._marked(renewed)
        timeout = self._timeout(deadline)
        replace_lease = lambda: self.rest.replace(LEASES, body, timeout=timeout)  # noqa: E731
        return self._write(replace_lease, deadline, started, "lost the race for the lease")

    def _renew_own_write(self, deadline: float | None, started: float, now: str) -> bool | None:
        """A leader's renewal without reading the Lease first (client-go's fast path): a PUT of the Lease
        as we last wrote it, conditional on that write's resourceVersion, so it succeeds only if nobody
        wrote the Lease since, which is stricter than a PUT after a GET. None when it was changed (409) or
        deleted (404) meanwhile, or is not ours as last seen: then the Lease is read (the usual path).
        Saves the GET of every renewal, one apiserver request every retry_period."""
        lease = self._lease
        if lease is None or lease.spec.holder_identity != self.identity or self._released_by_self():
            return None
        renewed = lease.with_spec(lease_duration_seconds=self._advertised_seconds(), renew_time=now)
        try:
            written = self.rest.replace(LEASES, self._marked(renewed), timeout=self._timeout(deadline))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            self.last_contact = time.monotonic()
            log.info("%r: the lease changed since our last renewal (%s); reading it", self, exc.status)
            return None
        self.last_contact = time.monotonic()
        self._observe(written)
        self._last_renew = started
        return True

    def _lease_seconds(self) -> int:
        return max(1, round(self.timings.duration))

    def _advertised_seconds(self) -> int:
        """spec.leaseDurationSeconds: the wait of replicas of older releases (see the module docstring)."""
        return max(self._lease_seconds(), round(self.timings.older_release_wait))

    def _released_by_self(self) -> bool:
        """The observed Lease is one this identity released (a restart under the same pod name)."""
        mark = self._observed_mark
        return mark is not None and mark.released and mark.holder == self.identity

    def _write(self, request: Callable[[], dict[str, Any]], deadline: float | None, started: float, race: str) -> bool:
        """Send a write of the Lease; on 409 another replica wrote first: re-read it, we do not lead."""
        try:
            written = request()
        except ApiException as exc:
            if exc.status != 409:
                raise
            log.info("%r: %s (409)", self, race)
            self._refresh_observation(self._timeout(deadline))
            return False
        self._observe(written)
        self._last_renew = started
        return True

    def _refresh_observation(self, timeout: float) -> None:
        try:
            self._observe(self.rest.get(LEASES, self.name, self.namespace, timeout=timeout))
        except Exception as exc:  # noqa: BLE001 - best effort; the caller already treats this as lost
            log.info("%r: could not re-read the lease after a conflict: %s", self, _short(exc))
            self._observed_spec = LeaseSpec(holder_identity="<unknown>")

    def _create(self, now: str, deadline: float | None, started: float) -> bool:
        lease = Lease.new(self.name, self.namespace).with_spec(
            holder_identity=self.identity,
            lease_duration_seconds=self._advertised_seconds(),
            acquire_time=now,
            renew_time=now,
            lease_transitions=0,
        )
        body = self._marked(lease)
        timeout = self._timeout(deadline)
        create_lease = lambda: self.rest.create(LEASES, body, self.namespace, timeout=timeout)  # noqa: E731
        return self._write(create_lease, deadline, started, "another replica created the lease first")

    def _release(self) -> None:
        """Give the lease up, so a replica of this release or a newer one takes it at once.

        The holder stays and the mark says `released`: an older release would take an empty holder
        at once, and must not (see the module docstring); it waits `older_release_wait`.
        """
        lease = self._lease
        if lease is None or lease.spec.holder_identity != self.identity:
            return
        released = lease.with_spec(lease_duration_seconds=self._advertised_seconds(), renew_time=_micro_time())
        body = self._marked(released, released=True)
        try:
            self.rest.replace(LEASES, body, timeout=self.timings.release_timeout)
            log.info("%r: released the lease", self)
        except Exception as exc:  # noqa: BLE001 - nothing left to do; the lease expires by itself
            log.warning("%r: could not release the lease (it expires by itself): %s", self, _short(exc))


def _typed(lease: Lease | Obj) -> Lease:
    return lease if isinstance(lease, Lease) else Lease.parse(lease)


def _short(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
