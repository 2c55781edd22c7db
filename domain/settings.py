"""The provider's built-in settings: one frozen object, `SETTINGS`, read by every place that needs them.

These are the constants the install config (domain/config.py, the user's YAML) does NOT expose: the
ports and files the rendered Deployment and the manager must agree on, the Lease timings, and every
retry, backoff and check interval of the runtime. Each value is written here once; the manifests
(infra/render.py passes them to infra/templates/), the `dbprovider manager` defaults (cli.py, manager.py),
the leader elector, the work queue, the informers, the Shard and Database controllers and the SQL
layer read them from here. Tests shorten timings by passing other values to the constructors, never
by changing this object (it is frozen).

    SETTINGS.ports.api / .metrics                   the manager's listening ports (container ports)
    SETTINGS.files.config / .tls_cert / .shard_ca   files of the one projected volume
    SETTINGS.env.config / .tls_cert / .tls_key      environment variables naming those files
    SETTINGS.env.shard_ca                           (and --shard-ca-file) the shard CA bundle outside a pod
    SETTINGS.probes.liveness / .readiness           the API's health paths (the Deployment's probes)
    SETTINGS.termination                            the pod's preStop drain and termination grace period
    SETTINGS.lease                                  Lease duration, renew deadline, retry period
    SETTINGS.retry                                  reconcile backoff, Database requeue intervals
    SETTINGS.watch                                  informer relist backoff, watch and request timeouts
    SETTINGS.shard_checks                           Shard ping intervals and timeouts
    SETTINGS.sql                                    SQL operation bounds and reconnect backoff
    SETTINGS.quota                                  the quota ledger's reservation timeout and retries
    SETTINGS.pod                                    the Deployment's memory and what API connections may use

A `Backoff` (base, factor, cap) is the one exponential scheme: the work queue, the informers' relist
and the SQL reconnects each hold one, with different numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: the pause before retry n (0 = the first) is base * factor**n, at most cap."""

    base: float
    factor: float = 2.0
    cap: float = math.inf

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.factor >= 1 and self.cap >= self.base):
            raise ValueError("need base > 0, factor >= 1 and cap >= base")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (counted from 0)."""
        try:
            return min(self.cap, self.base * self.factor ** max(0, retry))
        except OverflowError:  # far past the cap
            return self.cap

    def capped(self, cap: float) -> Backoff:
        """The same scheme with another cap (never below the base): tests shorten the long waits."""
        return replace(self, cap=max(cap, self.base))


@dataclass(frozen=True)
class Ports:
    """Ports the manager listens on; the Deployment's containerPorts and the metrics Service use them."""

    api: int = 8443  # HTTPS consumer API and /healthz, /readyz; unprivileged (the pod runs as non-root)
    metrics: int = 8080  # plain-HTTP /metrics, scraped through the metrics Service
    agent: int = 8080  # the consumer agent's plain-HTTP /metrics, /healthz and /readyz (its only port)


_MOUNT = "/etc/dbprovider"


@dataclass(frozen=True)
class MountedFiles:
    """Files the manager reads from its one projected volume (ConfigMap + TLS Secret + shard CA bundle),
    mounted at `dir`. One volume, so a renewed certificate or CA shows up without a restart."""

    dir: str = _MOUNT
    config: str = f"{_MOUNT}/config.yaml"  # the install config with defaults resolved
    tls_cert: str = f"{_MOUNT}/tls/tls.crt"  # the serving certificate from tls.secretName
    tls_key: str = f"{_MOUNT}/tls/tls.key"
    shard_ca: str = f"{_MOUNT}/shard-ca/ca.crt"  # shardTLS.caBundle: CAs for sslmode verify-ca / verify-full

    def in_volume(self, path: str) -> str:
        """`path` relative to the mount, as the volume's items (and the ConfigMap's key) name it."""
        if not path.startswith(f"{self.dir}/"):
            raise ValueError(f"{path} is not in {self.dir}")
        return path.removeprefix(f"{self.dir}/")


@dataclass(frozen=True)
class EnvNames:
    """Environment variables the Deployment sets and `dbprovider manager` reads."""

    config: str = "DBPROVIDER_CONFIG"
    tls_cert: str = "DBPROVIDER_TLS_CERT"
    tls_key: str = "DBPROVIDER_TLS_KEY"
    shard_ca: str = "DBPROVIDER_SHARD_CA_FILE"  # outside a pod: the shard CA bundle (--shard-ca-file)
    pod_name: str = "POD_NAME"  # the replica's identity in the Lease and the User-Agent
    pod_namespace: str = "POD_NAMESPACE"  # where the Lease lives


@dataclass(frozen=True)
class Probes:
    """Health paths the API serves and the Deployment probes (both on the API port, over HTTPS)."""

    liveness: str = "/healthz"  # 200 while the process serves requests
    readiness: str = "/readyz"  # 200 once the caches synced and the apiserver answers


@dataclass(frozen=True)
class Termination:
    """How a replica leaves its pod without failing a request (the Deployment's preStop and grace period).

    When a pod is deleted, SIGTERM and the removal of its address from the Services race: kube-proxy (or
    a load balancer) may still send new connections for a moment. So the pod first sleeps `drain`
    seconds serving as usual (a preStop sleep, while the Services stop sending it traffic), and only
    then gets SIGTERM: the manager stops accepting, finishes the requests in flight, stops its
    controllers and releases the Lease, all well within `grace` seconds.
    """

    drain: int = 5
    grace: int = 30


@dataclass(frozen=True)
class LeaseTimings:
    """Leader election on the `<release>-manager` Lease, with client-go's defaults.

    A leader that has not renewed for `renew_deadline` stops at once; another replica takes over only
    after seeing no change for `duration`, so with duration > renew_deadline two never lead together.
    Every replica asks every `retry_period` (jittered by up to `retry_jitter` of it, so replicas that
    started together do not ask together).
    """

    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    retry_jitter: float = 0.2
    # No request gets less time than this, even just before the renew deadline (a zero timeout would
    # fail without asking); the release on shutdown gets `release_timeout`.
    min_request_timeout: float = 0.2
    release_timeout: float = 5.0
    # The apiserver counts as reachable while a lease request succeeded within this many retry periods
    # (and at least `min_contact_window` seconds): a slow answer or two is no outage.
    contact_periods: int = 3
    min_contact_window: float = 5.0
    # What a replica of an OLDER release waits before it takes the Lease from one of this release (the
    # Lease's leaseDurationSeconds, which is all an older release reads; replicas of this release read
    # the real `duration` from the Lease's annotation): during a rollout, and after a newer replica's
    # crash, an older replica never leads again while a newer one is around (docs/upgrade.md).
    older_release_wait: float = 300.0

    def __post_init__(self) -> None:
        if not self.duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")
        if self.older_release_wait < self.duration:
            raise ValueError("need older_release_wait >= lease_duration")


@dataclass(frozen=True)
class RetryTimings:
    """How controllers retry: the per-key backoff of a failed reconcile and fixed requeue intervals."""

    # client-go's default rate limiter: 1 s doubling, at most 5 min (the alerts' `for:` windows assume it).
    reconcile: Backoff = Backoff(base=1.0, factor=2.0, cap=300.0)
    # No ready shard with room: capacity comes from a human adding a shard, so look again rarely.
    no_capacity: float = 300.0
    # Shards exist but none is Ready: shard checks run every few seconds, so look again soon.
    shards_unavailable: float = 30.0
    # A terminal SQL failure (a foreign object holds the name, a missing privilege): a human fixes it,
    # and any change of the Database or its Shard retries at once; this slow look keeps the alert alive.
    terminal: float = 300.0
    # Cache sync on start: a list that gets no page from the apiserver for this long fails the start
    # loudly (a list of 100,000 objects may take longer in all, page by page).
    sync_timeout: float = 60.0


@dataclass(frozen=True)
class WatchTimings:
    """The informers' list+watch against the apiserver."""

    # After a failed list/watch: 1 s doubling to 30 s, times a random 0.8-1.0 (relists spread out).
    relist: Backoff = Backoff(base=1.0, factor=2.0, cap=30.0)
    relist_jitter: float = 0.2
    # Server-side watch timeout, random in this range (client-go's 5-10 min) so watches do not end together.
    watch_timeout: tuple[int, int] = (300, 600)
    # (connect, read) seconds of an ordinary apiserver request.
    request_timeout: tuple[float, float] = (10.0, 60.0)
    # Objects per LIST page. The apiserver pays per page as well as per object: 100,000 Secrets cost it
    # about a third of the CPU in pages of 5,000 that they cost in pages of 500; a page of 5,000 Databases
    # is about 15 MB of JSON.
    list_page_size: int = 5000
    # Fill the caches with a streamed list (a WATCH with sendInitialEvents: the WatchList feature, on by
    # default in Kubernetes 1.32 and from 1.34; an apiserver that refuses it is listed page by page). A
    # paginated LIST's later pages are served from etcd once a compaction has passed the collection's last
    # write: 2-3x the start at 100,000 Databases (docs/performance.md, section 5).
    stream_lists: bool = True


@dataclass(frozen=True)
class CheckTimeouts:
    """The bounds of one shard check (seconds): connect and authenticate, and the whole check."""

    connect: float
    total: float


@dataclass(frozen=True)
class ShardChecks:
    """The Shard controller's pings: a failure is seen, and a recovery taken up, well within a minute.

    The timeouts adapt to the link: the base values hold on a near link, and each
    grows by a number of measured round trips (a TLS + SCRAM login is about 7 of them), up to the
    maxima, so a shard 200 ms away that answers is Ready while a dead one is still told apart
    (`timeouts(round_trip)`).
    """

    ready_interval: float = 15.0  # a Ready shard is pinged this often, in a small fleet
    # A large fleet spreads its Ready checks out: each is a fresh TLS + SCRAM login (milliseconds of the
    # manager's CPU), 13 a second for 200 shards at 15 s (several percent of a core while idle). So the
    # Ready checks of all shards together stay under this rate, the interval growing with the Shard count
    # up to 60 s (the longest a broken admin Secret may take to show): 15 s up to 45 shards, 60 s from 180.
    # A shard whose SQL fails or hangs is checked at once whatever the interval (ShardSuspects.suspect).
    ready_checks_per_second: float = 3.0
    max_ready_interval: float = 60.0
    # The Ready checks end on a grid of this many seconds (at most a quarter of the interval), so those
    # due within the same stretch start together on the Shard workers instead of one at a time: the
    # rate and each shard's interval stay (shortened by less than this), and a check that starts beside
    # others costs the manager a third less CPU than one alone between other processes' work (its code
    # and OpenSSL's stay in the caches).
    ready_check_grid: float = 2.0
    not_ready_interval: float = 5.0  # a shard that is not Ready, more often
    # Within this gap (and for an unchanged generation) a burst of Database changes reuses the last result.
    min_gap: float = 10.0
    timeout: float = 5.0  # one whole ping on a near link: connect, authenticate, read the catalog
    connect_timeout: float = 3.0
    connect_round_trips: int = 10  # TCP, TLS, startup and SCRAM, with room to spare
    check_round_trips: int = 4  # the check's statements
    max_connect_timeout: float = 15.0
    max_timeout: float = 20.0
    # Without a measurement (the check timed out), the round-trip estimate doubles from this.
    min_round_trip_guess: float = 0.25
    # SQL of a Database worker that has run this long without an answer asks for a check now: if the
    # shard no longer answers, its sessions are cut and the work waits (instead of the 2 min bound).
    suspect_after: float = 5.0

    def ready_interval_for(self, shards: int, interval: float | None = None) -> float:
        """The Ready check interval of one shard in a fleet of `shards`: `interval` (default
        ready_interval) while the fleet's checks stay under ready_checks_per_second, longer beyond."""
        base = self.ready_interval if interval is None else interval
        return max(base, min(self.max_ready_interval, shards / self.ready_checks_per_second))

    def timeouts(self, round_trip: float) -> CheckTimeouts:
        """The check's (and the admin sessions' connect) timeouts on a link of `round_trip` seconds."""
        round_trip = max(0.0, round_trip)
        connect = min(self.max_connect_timeout, self.connect_timeout + self.connect_round_trips * round_trip)
        extra = (self.connect_round_trips + self.check_round_trips) * round_trip
        total = min(self.max_timeout, self.timeout + extra)
        return CheckTimeouts(connect, max(total, connect))


@dataclass(frozen=True)
class SqlTimings:
    """Bounds of the admin sessions' SQL work on a shard."""

    operation_timeout: float = 120.0  # one whole operation, reconnects and retries included
    statement_timeout: str = "60s"  # the server-side bound of one statement (a PostgreSQL setting)
    lock_timeout: str = "10s"  # a tenant's lock cannot stall DDL longer (then the step is retried)
    connect_timeout: float = 10.0  # per connection attempt (libpq enforces at least 2)
    # TCP keepalives and tcp_user_timeout of every admin session: a peer that vanished from the network
    # (a partition, a dead node) ends the session within seconds instead of the kernel's 2 hours.
    keepalives_idle: int = 5
    keepalives_interval: int = 2
    keepalives_count: int = 3
    tcp_user_timeout_ms: int = 10_000
    # A failure that says more about the shard than the database (timeouts, lost connections) is
    # retried with the usual backoff, but never more than this apart: a recovered shard is used soon.
    shard_trouble_retry_cap: float = 30.0
    # A lost connection (failover) is retried this often on a new session, after 0.2 s, 1 s, then 2 s.
    reconnect_retries: int = 3
    reconnect: Backoff = Backoff(base=0.2, factor=5.0, cap=2.0)
    # Disable and drop: attempts of the whole close sequence when a tenant session blocks it (each
    # ends the tenant's sessions first and waits at most lock_timeout).
    blocked_attempts: int = 4


_MIB = 2**20


@dataclass(frozen=True)
class PodResources:
    """The manager container's default memory (resources.manager's defaults in the install config), and the
    share of its limit that API connections may take: what the install config's api.maxConnections is checked
    against (with the limit the install config sets).

    The manager itself keeps `manager_room` (about 145 MB RSS at 10,000 Databases, docs/performance.md
    section 3, with room to grow); each connection is counted at `connection_bytes`, the worst kind measured by
    `python -m bench.front_door` (a connection in the middle of a request body), rounded up.
    """

    memory_request_mib: int = 192
    memory_limit_mib: int = 512
    manager_room_mib: int = 256
    connection_bytes: int = 96 * 1024

    @property
    def connections_bytes(self) -> int:
        """The memory left for API connections."""
        return (self.memory_limit_mib - self.manager_room_mib) * _MIB

    @property
    def max_connections(self) -> int:
        return self.connections_bytes // self.connection_bytes


@dataclass(frozen=True)
class QuotaTimings:
    """The per-consumer quota ledger (domain/quota.py): how long a reservation without a database holds
    its slot, and how the API writes the ledger."""

    # A reserved slot whose database the apiserver does not have is freed only after this long: longer
    # than a create can still be committed after it was sent (the apiserver's default --request-timeout
    # is 60 s), so a freed slot never belongs to a create that lands later. It is also how long a
    # replica killed between reserving and creating holds one slot.
    reservation_timeout: float = 120.0
    # How far the replicas' clocks may differ: a reservation dated further in the future than this was
    # not written by a replica, and is checked against the apiserver at once (freed if its database is
    # not there) instead of holding its slot until its time has passed and the timeout after it.
    clock_skew: float = 60.0
    # A replica sends its create only this soon after its reservation was written (else it gives the
    # slot back and answers 503), which keeps it far inside reservation_timeout even when it was paused.
    create_deadline: float = 10.0
    # Compare-and-swap attempts of one ledger write before the API answers 503 (each conflict means
    # another replica's write for the same consumer went through).
    write_attempts: int = 20


@dataclass(frozen=True)
class Settings:
    """Everything above, as one value (see the module docstring)."""

    ports: Ports = field(default_factory=Ports)
    files: MountedFiles = field(default_factory=MountedFiles)
    env: EnvNames = field(default_factory=EnvNames)
    probes: Probes = field(default_factory=Probes)
    termination: Termination = field(default_factory=Termination)
    run_as_uid: int = 10001  # the image's USER (Dockerfile); the Deployment's runAsUser/runAsGroup/fsGroup
    lease: LeaseTimings = field(default_factory=LeaseTimings)
    retry: RetryTimings = field(default_factory=RetryTimings)
    watch: WatchTimings = field(default_factory=WatchTimings)
    shard_checks: ShardChecks = field(default_factory=ShardChecks)
    sql: SqlTimings = field(default_factory=SqlTimings)
    quota: QuotaTimings = field(default_factory=QuotaTimings)
    pod: PodResources = field(default_factory=PodResources)


SETTINGS = Settings()
