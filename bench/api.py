"""API cost: authenticated GET /v1/databases/{id} vs a bare Falcon route on the same server stack,
and the per-request auth lookup with 1,000 consumers vs one.

    python -m bench.api [--clients 32] [--seconds 5] [--rounds 4] [--consumers 1000] [--profile]

(Run it as a module: `python bench/api.py` would shadow the product's `api` package.)

Throughput: one server process (`--serve`, started by the benchmark) runs the product's API exactly
as the manager does (`build_api` on the shared informers, authenticated as the provider's
ServiceAccount, `ApiServer` (api/server.py) with TLS and 16 threads) and, on a second port of the same
process with the same `ApiServer` options, a bare Falcon app whose one route returns a constant
body of the same shape. Client processes (2, with `--clients` keep-alive TLS connections in all)
hammer one and then the other, alternating for `--rounds` rounds of `--seconds` each. Throughput is
the median round; p99 is over every request of the rounds at that concurrency. The apiserver holds
`--consumers` extra Consumers (3 token hashes each) while this runs, so the API's token index is big.
Target: API throughput >= 0.5x the bare route.

Under attack: the same authenticated GET load on the API, in rounds alternating with
and without hostile connections held against the same server: `--attack-slow` (64) TLS connections
sending their headers a byte a second, `--attack-silent` (8) TCP sockets that never send a TLS hello
and `--attack-idle` (200) TLS connections idle after the handshake, each reopened as the server's
deadlines drop it, from 127.0.0.2-127.0.0.9 (below the per-address cap, so they are all held).
Targets: throughput >= 0.8x and p99 <= 2x the rounds without them.

Auth: two token indexes (`TokenIndex` on informers narrowed by a label selector) live in this
process side by side, one over 1 Consumer and one over `--consumers` Consumers with 3 hashes each;
`AuthMiddleware.process_resource` on a prepared request is timed on both, interleaved, many
iterations per round. Target: many/one <= 1.1x (best rounds; the median rounds are shown too).
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import signal
import socket
import ssl
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from bench.common import (
    ResultsFiles,
    Stack,
    Target,
    bench_parser,
    fmt_s,
    interleaved,
    log,
    machine_line,
    percentile,
    pyinstrument_profile,
    pyinstrument_text,
    ratio_of,
    report_targets,
    table,
    wait_for,
)
from domain.constants import API_VERSION, KIND_CONSUMER
from domain.objects import Obj
from informers import Informer
from informers.informer import Handler

THROUGHPUT_TARGET = 0.5
ATTACK_THROUGHPUT_TARGET = 0.8
ATTACK_P99_TARGET = 2.0
ATTACK_SOURCES = tuple(f"127.0.0.{n}" for n in range(2, 10))
AUTH_TARGET = 1.1
VIEW = {
    "externalId": "bench-0",
    "phase": "Ready",
    "reason": "Provisioned",
    "sizeClass": "small",
    "connectionLimit": 5,
    "engine": "postgres",
    "createdAt": "2026-11-30T08:15:00Z",
    "deleteRequestedAt": None,
    "dropAfter": None,
    "rotateRequestedAt": None,
    "rotationPending": False,
}


# -- the server process ----------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    """The product's API and a bare Falcon route, in one process with the same ApiServer options."""
    import falcon
    from prometheus_client import CollectorRegistry

    from api import ApiServer, build_api
    from dbprovider.logs import configure_logging
    from dbprovider.manager import kube_client
    from domain.config import load_install_config_file
    from informers import Rest, SharedInformers

    configure_logging()
    import logging

    logging.getLogger("api.access").setLevel(logging.WARNING)  # as in production: no log cost per request
    config = load_install_config_file(args.config)
    informers = SharedInformers(Rest(kube_client(args.kubeconfig)))
    components = build_api(config, informers, registry=CollectorRegistry())

    class Bare:
        auth_required = False

        def on_get(self, req: falcon.Request, resp: falcon.Response, externalId: str) -> None:  # noqa: N803
            resp.media = VIEW

    bare = falcon.App()
    bare.add_route("/v1/databases/{externalId}", Bare())
    informers.start()
    informers.wait_for_sync(60)
    servers = [
        ApiServer(components.app, "127.0.0.1", args.real_port, args.cert, args.key),
        ApiServer(bare, "127.0.0.1", args.bare_port, args.cert, args.key),
    ]
    for server in servers:
        server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    for server in servers:
        server.stop()
    informers.stop()
    return 0


# -- clients ---------------------------------------------------------------------------------------


class ClientRun(TypedDict):
    """What one client process measured (returned through the process pool, so a plain dict)."""

    latencies: list[float]
    errors: list[str]


class LoadRun(ClientRun):
    """One round of load on one server: the client processes' results, with throughput and CPU."""

    rps: float
    server_cpu: float
    machine_busy: float


class AttackRounds(TypedDict):
    """The rounds without and with the hostile connections, how many each attacked round opened, and which."""

    quiet: list[LoadRun]
    attacked: list[LoadRun]
    opened: list[int]
    what: str


class RoundsSummary(TypedDict):
    """The rounds of one server summarized, in the units the tables print."""

    rps: float
    p50: float
    p99: float
    errors: int
    server_us: float
    server_core: float
    machine_core: float
    rounds: str


def client_process(
    port: int, path: str, token: str, ca: str, threads: int, start_at: float, seconds: float
) -> ClientRun:
    """`threads` keep-alive TLS clients GET `path` from start_at for `seconds`; latencies and errors."""
    context = ssl.create_default_context(cafile=ca)
    headers = {"Authorization": f"Bearer {token}"}
    results: list[list[float]] = [[] for _ in range(threads)]
    errors: list[str] = []

    def connect() -> http.client.HTTPSConnection:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
        conn.connect()
        return conn

    def run(n: int) -> None:
        conn = connect()
        latencies = results[n]
        time.sleep(max(0.0, start_at - time.time()))
        end = start_at + seconds
        while True:
            started = time.perf_counter()
            if time.time() >= end:
                break
            try:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    errors.append(f"HTTP {response.status}")
                    continue
            except (OSError, http.client.HTTPException) as exc:
                errors.append(type(exc).__name__)
                conn.close()
                conn = connect()
                continue
            latencies.append(time.perf_counter() - started)
        conn.close()

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {"latencies": [x for r in results for x in r], "errors": errors}


def load(
    port: int, path: str, token: str, ca: str, clients: int, seconds: float, pool: Any, server_pid: int | None = None
) -> LoadRun:
    """`clients` connections over two client processes; requests/s, latencies, and the CPU the server
    process and the whole machine used while the clock ran."""
    import psutil

    processes = 2
    start_at = time.time() + 1.5  # every connection is open (TLS handshake done) before the clock starts
    per = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    jobs = [pool.apply_async(client_process, (port, path, token, ca, n, start_at, seconds)) for n in per if n]
    server = psutil.Process(server_pid) if server_pid else None
    time.sleep(max(0.0, start_at - time.time()))
    server_before = sum(server.cpu_times()[:2]) if server else 0.0
    machine_before = psutil.cpu_times()
    time.sleep(max(0.0, start_at + seconds - time.time()))
    server_cpu = sum(server.cpu_times()[:2]) - server_before if server else 0.0
    machine_after = psutil.cpu_times()
    busy = (sum(machine_after) - machine_after.idle - machine_after.iowait) - (
        sum(machine_before) - machine_before.idle - machine_before.iowait
    )
    latencies: list[float] = []
    errors: list[str] = []
    for job in jobs:
        result: ClientRun = job.get(timeout=seconds + 120)
        latencies += result["latencies"]
        errors += result["errors"]
    return {
        "rps": len(latencies) / seconds,
        "latencies": latencies,
        "errors": errors,
        "server_cpu": server_cpu,
        "machine_busy": busy / seconds,
    }


# -- setup -----------------------------------------------------------------------------------------


def create_consumers(rest: Any, namespace: str, label: str, count: int, prefix: str) -> list[str]:
    """`count` Consumers labelled bench-auth=<label>, each with a token Secret of 3 hashes; the tokens
    of the first hash of each."""
    import base64
    import secrets as pysecrets

    from domain.resources import CONSUMERS
    from domain.tokens import hash_token
    from informers import SECRETS

    def one(i: int) -> str:
        name = f"{prefix}-{i:04d}"
        tokens = [pysecrets.token_hex(32) for _ in range(3)]
        hashes = "\n".join(hash_token(t) for t in tokens)
        rest.create(
            SECRETS,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"{name}-token", "namespace": namespace, "labels": {"bench-auth": label}},
                "data": {"sha256": base64.b64encode(hashes.encode()).decode()},
            },
            namespace,
        )
        rest.create(
            CONSUMERS,
            {
                "apiVersion": API_VERSION,
                "kind": KIND_CONSUMER,
                "metadata": {"name": name, "labels": {"bench-auth": label}},
                "spec": {
                    "tokenSecretRef": {"namespace": namespace, "name": f"{name}-token", "key": "sha256"},
                    "maxDatabases": 10,
                },
            },
        )
        return tokens[0]

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, range(count)))


def create_ready_database(rest: Any, stack: Stack, external_id: str) -> None:
    from bench.scale import ready_status
    from domain.constants import API_VERSION, FINALIZER_TENANT, KIND_DATABASE
    from domain.credentials import Endpoint, build_secret, new_password, password_id
    from domain.naming import database_object_name, tenant_name
    from domain.resources import DATABASES
    from informers import SECRETS

    dev, pg = stack.dev, stack.postgres
    db = rest.create(
        DATABASES,
        {
            "apiVersion": API_VERSION,
            "kind": KIND_DATABASE,
            "metadata": {
                "name": database_object_name(dev.consumer, external_id),
                "namespace": dev.namespace,
                "finalizers": [FINALIZER_TENANT],
            },
            "spec": {"consumer": dev.consumer, "externalId": external_id, "sizeClass": "small", "engine": "postgres"},
        },
        dev.namespace,
    )
    tenant = tenant_name(external_id, db["metadata"]["uid"])
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    secret = build_secret(db, tenant, new_password(), Endpoint("127.0.0.1", pg.port, "disable"))
    status = {**ready_status(dev.shard, tenant, now), "passwordApplied": password_id(secret)}
    rest.patch(DATABASES, db["metadata"]["name"], {"status": status}, dev.namespace, subresource="status")
    rest.create(SECRETS, secret, dev.namespace)


# -- auth ------------------------------------------------------------------------------------------


class LabelledSecrets:
    """The bench's token Secrets, selected by label (one informer), in the shape TokenIndex reads."""

    def __init__(self, informer: Informer, namespace: str) -> None:
        self.informer, self.namespace = informer, namespace

    def want(self, names: Iterable[str]) -> None:
        """All labelled Secrets are cached already."""

    def add_handler(self, handler: Handler) -> object:
        return self.informer.add_handler(handler)

    def get(self, name: str) -> Obj | None:
        return self.informer.get(f"{self.namespace}/{name}")

    def has_synced(self) -> bool:
        return self.informer.has_synced()


def auth_benchmark(
    stack: Stack, one_token: str, many_token: str, rounds: int, iterations: int, profile: bool, profile_dir: Path
) -> tuple[dict[str, list[float]], str | None]:
    import logging

    import falcon.testing

    from api import AuthMiddleware, TokenIndex
    from domain.resources import CONSUMERS
    from informers import SECRETS, Informer

    logging.getLogger("api.auth").setLevel(logging.ERROR)  # "token Secret is missing" while the informers list
    namespace = stack.dev.namespace
    rest = stack.admin_rest(8)
    informers = []
    middlewares = {}
    for label in ("one", "many"):
        consumers = Informer(rest, CONSUMERS, label_selector=f"bench-auth={label}")
        secrets = Informer(rest, SECRETS, namespace, label_selector=f"bench-auth={label}")
        index = TokenIndex(consumers, LabelledSecrets(secrets, namespace), namespace)
        informers += [consumers.start(), secrets.start()]
        consumers.wait_for_sync(60)
        secrets.wait_for_sync(60)
        wait_for(index.ready, 30, f"token index {label}")
        middlewares[label] = (AuthMiddleware(index), len(consumers))
    try:

        class Resource:
            auth_required = True

        resource = Resource()

        def call(label: str, token: str) -> Callable[[], None]:
            middleware, _ = middlewares[label]
            req = falcon.testing.create_req(path="/v1/databases/x", headers={"Authorization": f"Bearer {token}"})
            resp = falcon.Response()

            def once() -> None:
                middleware.process_resource(req, resp, resource, {})
                assert req.context.consumer is not None

            return once

        variants = {
            "1 consumer": call("one", one_token),
            f"{middlewares['many'][1]} consumers": call("many", many_token),
        }
        interleaved(variants, 2, iterations // 10)  # warm-up
        samples = interleaved(variants, rounds, iterations)
        text = None
        if profile:
            profiler = pyinstrument_profile()
            for _ in range(iterations):
                variants[f"{middlewares['many'][1]} consumers"]()
            profile_dir.mkdir(parents=True, exist_ok=True)
            text = pyinstrument_text(profiler, profile_dir / "api-auth.pyinstrument.txt")
        return samples, text
    finally:
        for informer in informers:
            informer.stop()


# -- under attack ----------------------------------------------------------------------------------


def attack_rounds(
    args: argparse.Namespace, port: int, path: str, token: str, ca: str, pool: Any, server_pid: int
) -> AttackRounds:
    """Rounds of the GET load alternating without and with the hostile connections held."""
    from harness.attacks import HostileClients

    total = args.attack_slow + args.attack_silent + args.attack_idle
    what = (
        f"{args.attack_slow} slow-header, {args.attack_silent} silent TCP and {args.attack_idle} idle TLS connections"
    )
    done: AttackRounds = {"quiet": [], "attacked": [], "opened": [], "what": what}
    for n in range(args.rounds):
        for name in ("quiet", "attacked") if n % 2 == 0 else ("attacked", "quiet"):
            if name == "quiet":
                done["quiet"].append(load(port, path, token, ca, args.clients, args.seconds, pool, server_pid))
                continue
            with HostileClients(
                port,
                slow=args.attack_slow,
                silent=args.attack_silent,
                idle=args.attack_idle,
                byte_every=1.0,
                sources=ATTACK_SOURCES,
                max_seconds=args.seconds + 120,
            ) as attack:
                wait_for(lambda: attack.opened >= total, 60, "the hostile connections", 0.2)
                result = load(port, path, token, ca, args.clients, args.seconds, pool, server_pid)
                done["opened"].append(attack.opened)
            done["attacked"].append(result)
        log(
            f"attack round {n + 1}: without {done['quiet'][-1]['rps']:.0f} req/s, "
            f"with {done['attacked'][-1]['rps']:.0f} req/s ({len(done['attacked'][-1]['errors'])} errors)"
        )
    return done


def summarize_rounds(done: list[LoadRun], seconds: float) -> RoundsSummary:
    """Median round throughput, p50/p99 over every request of the rounds, errors, CPU."""
    latencies = [x for r in done for x in r["latencies"]]
    requests_done = sum(len(r["latencies"]) for r in done)
    return {
        "rps": statistics.median(r["rps"] for r in done),
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "errors": sum(len(r["errors"]) for r in done),
        "server_us": 1e6 * sum(r["server_cpu"] for r in done) / max(1, requests_done),
        "server_core": 100 * statistics.median(r["server_cpu"] / seconds for r in done),
        "machine_core": 100 * statistics.median(r["machine_busy"] for r in done),
        "rounds": " ".join(f"{r['rps']:.0f}" for r in done),
    }


def load_row(label: str, summary: RoundsSummary, columns: Sequence[str]) -> tuple[Any, ...]:
    """A summary of rounds as a table row: `label`, the `columns` asked, then each round's req/s."""
    cells = {
        "req/s": f"{summary['rps']:.0f}",
        "p50": fmt_s(summary["p50"]),
        "p99": fmt_s(summary["p99"]),
        "errors": summary["errors"],
        "server CPU/request": f"{summary['server_us']:.0f} us",
        "server CPU": f"{summary['server_core']:.0f}%",
        "machine busy (of 200%)": f"{summary['machine_core']:.0f}%",
    }
    return (label, *(cells[column] for column in columns), summary["rounds"])


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, profile="pyinstrument on the auth lookup; py-spy on the server")
    parser.add_argument("--clients", type=int, default=32, help="concurrent keep-alive clients (default 32)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per round (default 5)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per variant (default 4)")
    parser.add_argument("--consumers", type=int, default=1000, help="consumers for the auth figure (default 1000)")
    parser.add_argument("--attack-slow", type=int, default=64, help="slow-header TLS connections (default 64)")
    parser.add_argument("--attack-silent", type=int, default=8, help="silent TCP sockets (default 8)")
    parser.add_argument("--attack-idle", type=int, default=200, help="idle TLS connections (default 200)")
    parser.add_argument("--auth-rounds", type=int, default=15)
    parser.add_argument("--auth-iterations", type=int, default=20000)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--cert", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    parser.add_argument("--real-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bare-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args)

    from bench.common import PySpy, summarize_collapsed
    from harness.process import free_port, spawn
    from harness.process import stop as stop_process

    print(
        f"API: GET /v1/databases/{{id}} vs a bare Falcon route, {args.clients} clients, "
        f"{args.rounds} x {args.seconds:.0f} s each; auth with {args.consumers} consumers vs 1"
    )
    print(f"machine: {machine_line()}")
    stack = Stack("api")
    server = None
    pool = None
    try:
        dev = stack.start_dev()
        rest = stack.admin_rest(24)
        create_ready_database(rest, stack, "bench-0")
        log(f"creating 1 + {args.consumers} consumers with 3 token hashes each")
        one_token = create_consumers(rest, dev.namespace, "one", 1, "auth-one")[0]
        many_tokens = create_consumers(rest, dev.namespace, "many", args.consumers, "auth-many")
        many_token = many_tokens[len(many_tokens) // 2]

        real_port, bare_port = free_port(), free_port()
        log_file = stack.state_dir / "api-server.log"
        server = spawn(
            [
                sys.executable,
                "-m",
                "bench.api",
                "--serve",
                "--config",
                str(dev.config_file),
                "--kubeconfig",
                str(dev.manager_kubeconfig),
                "--cert",
                str(dev.tls_cert),
                "--key",
                str(dev.tls_key),
                "--real-port",
                str(real_port),
                "--bare-port",
                str(bare_port),
            ],
            log_file,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
        ca = str(dev.ca_file)
        path = "/v1/databases/bench-0"

        def answers() -> bool:
            if server.poll() is not None:
                raise RuntimeError(f"API server exited: {log_file.read_text()[-2000:]}")
            try:
                # A plain connect first: the client's threads would print a traceback per refusal.
                socket.create_connection(("127.0.0.1", real_port), timeout=1).close()
                out = client_process(real_port, path, dev.token, ca, 1, time.time(), 0.2)
                return bool(out["latencies"])
            except OSError:
                return False

        wait_for(answers, 90, "the API server", 0.5)
        pool = multiprocessing.get_context("spawn").Pool(2)
        log("warm-up")
        load(bare_port, path, dev.token, ca, args.clients, 1.0, pool)
        load(real_port, path, dev.token, ca, args.clients, 1.0, pool)
        rounds: dict[str, list[LoadRun]] = {"bare": [], "api": []}
        for n in range(args.rounds):
            order = ("bare", "api") if n % 2 == 0 else ("api", "bare")
            for name in order:
                port = bare_port if name == "bare" else real_port
                result = load(port, path, dev.token, ca, args.clients, args.seconds, pool, server.pid)
                rounds[name].append(result)
                log(
                    f"round {n + 1} {name}: {result['rps']:.0f} req/s, {len(result['errors'])} errors, "
                    f"server {100 * result['server_cpu'] / args.seconds:.0f}% of a core, "
                    f"machine {100 * result['machine_busy']:.0f}% of a core"
                )
        hostile = attack_rounds(args, real_port, path, dev.token, ca, pool, server.pid)
        spy_text = None
        if args.profile:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            spy = PySpy(server.pid, args.profile_dir / "api-server.pyspy.txt").start()
            load(real_port, path, dev.token, ca, args.clients, args.seconds, pool)
            spy.stop()
            spy_text = summarize_collapsed(spy.out)

        log(f"auth: {args.auth_rounds} rounds of {args.auth_iterations} lookups per index")
        auth, auth_profile = auth_benchmark(
            stack, one_token, many_token, args.auth_rounds, args.auth_iterations, args.profile, args.profile_dir
        )

        bare, api = summarize_rounds(rounds["bare"], args.seconds), summarize_rounds(rounds["api"], args.seconds)
        bare_rps, api_rps, api_p99 = bare["rps"], api["rps"], api["p99"]
        ratio = api_rps / bare_rps
        throughput = ("req/s", "p50", "p99", "errors", "server CPU/request", "server CPU", "machine busy (of 200%)")
        table(
            f"throughput at {args.clients} concurrent keep-alive TLS clients (median of {args.rounds} rounds)",
            [
                load_row(label, r, throughput)
                for label, r in (("bare Falcon route, same ApiServer", bare), ("GET /v1/databases/{externalId}", api))
            ],
            ("route", *throughput, "rounds req/s"),
        )
        print(f"  server CPU per request, API / bare: {api['server_us'] / bare['server_us']:.2f}x")
        names = list(auth)
        best, median = ratio_of(auth, names[1], names[0])
        table(
            f"AuthMiddleware.process_resource, {args.auth_iterations} calls per round, {args.auth_rounds} rounds",
            [(name, f"{1e6 * min(v):.2f} us", f"{1e6 * statistics.median(v):.2f} us") for name, v in auth.items()]
            + [("ratio", f"{best:.3f}x", f"{median:.3f}x")],
            ("token index", "best round", "median round"),
        )
        if spy_text:
            print("\n== py-spy, API server process during one more round on the API\n" + spy_text)
        if auth_profile:
            print("\n== pyinstrument, the auth lookup with the big index\n" + auth_profile[:4000])
        quiet, attacked = (
            summarize_rounds(hostile["quiet"], args.seconds),
            summarize_rounds(hostile["attacked"], args.seconds),
        )
        attack_rps = attacked["rps"] / quiet["rps"]
        attack_p99 = attacked["p99"] / quiet["p99"]
        under_attack = ("req/s", "p50", "p99", "errors", "server CPU")
        table(
            f"GET /v1/databases/{{externalId}} with and without {hostile['what']} (median of {args.rounds} rounds)",
            [load_row(label, r, under_attack) for label, r in (("without", quiet), ("while held", attacked))]
            + [("ratio", f"{attack_rps:.2f}x", "", f"{attack_p99:.2f}x", "", "", "")],
            ("hostile connections", *under_attack, "rounds req/s"),
        )
        print(
            f"  attack connections opened per round (the server's deadlines drop them; they reopen): "
            f"{' '.join(str(n) for n in hostile['opened'])}"
        )
        report_targets(
            [
                Target(
                    f"API throughput {api_rps:.0f} / bare {bare_rps:.0f} req/s = {ratio:.2f}x",
                    f">= {THROUGHPUT_TARGET}x",
                    ratio >= THROUGHPUT_TARGET,
                    key="throughput",
                    what="GET throughput of the API, over a bare Falcon route on the same server",
                    value=ratio,
                    unit="x",
                ),
                Target(
                    f"throughput under attack {attacked['rps']:.0f} / {quiet['rps']:.0f} req/s = {attack_rps:.2f}x",
                    f">= {ATTACK_THROUGHPUT_TARGET}x",
                    attack_rps >= ATTACK_THROUGHPUT_TARGET,
                    key="attack-throughput",
                    what="GET throughput while slow-header, silent and idle TLS connections are held, over without",
                    value=attack_rps,
                    unit="x",
                ),
                Target(
                    f"p99 under attack {attacked['p99'] * 1000:.1f} / {quiet['p99'] * 1000:.1f} ms = {attack_p99:.2f}x",
                    f"<= {ATTACK_P99_TARGET}x",
                    attack_p99 <= ATTACK_P99_TARGET,
                    key="attack-p99",
                    what="GET p99 while slow-header, silent and idle TLS connections are held, over without",
                    value=attack_p99,
                    unit="x",
                ),
                Target(
                    f"auth cost {names[1]} / 1 consumer = {best:.3f}x (median rounds {median:.3f}x)",
                    f"<= {AUTH_TARGET}x",
                    best <= AUTH_TARGET,
                    key="auth",
                    what="the auth lookup with 1,000 consumers, over one consumer (best rounds)",
                    value=best,
                    unit="x",
                ),
            ],
            ResultsFiles.of("bench.api", args, argv),
        )
        print(
            f"API p99 at {args.clients} clients: {api_p99 * 1000:.1f} ms (bare route {bare['p99'] * 1000:.1f} ms); "
            f"server CPU per request API/bare {api['server_us'] / bare['server_us']:.2f}x"
        )
    finally:
        if pool is not None:
            pool.terminate()
        if server is not None:
            stop_process(server)
        stack.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
