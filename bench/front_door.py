"""The API's front door under attack, with the real manager: legitimate requests' throughput and p99
under each attack as ratios to the same run without it, and the memory each kind of connection costs.

    python -m bench.front_door [--seconds 10] [--rounds 3] [--connections 300] [--attacks chunk,idle TLS]
    python -m bench.front_door --compare [--seconds 20] [--candidates ours,cheroot,uvicorn,granian]

Default run, one `dbprovider manager` on a real apiserver and PostgreSQL:
- a legitimate client makes authenticated GETs of /v1/databases, each on a new TLS connection with a
  kubelet probe's 3 s timeout, for `--seconds` per phase, in rounds of: alone, under the chunk attack
  (50 TLS connections sending request bodies in 1-byte chunks as fast as they can, reconnecting when
  refused), alone, under the idle-TLS attack (400 TLS connections from 8 addresses that send nothing,
  reopened when dropped); beside each attacked run the attacker's CPU and the connections the server
  refused or dropped per second. The attackers run in a process of their own at nice 10: on a shared 2-core
  machine their CPU would otherwise be measured instead of the server's.
  Ratios per round against the mean of the two runs alone around it; the median over rounds is the figure.
- memory (first, each kind on a fresh manager): its RSS before and after `--connections` connections of
  each kind (idle TLS, mid-handshake, mid-body with 8 KiB and with 22 KiB of the body sent), per
  connection; and whether api.maxConnections times the worst of them
  fits the budget the install config is checked against (domain/config.py).

`--compare` is the measurement the front door was chosen by: each candidate serves the same bare
Falcon app over TLS while silent, slow-header and idle TLS connections are held. Candidates: `ours`,
`cheroot` (the server before it), `uvicorn` (h11; `pip install uvicorn a2wsgi`) and `granian` (`pip install granian`).
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from bench.common import bench_parser, machine_line, percentile, table

FRAMING_CASES = {
    "TE on HTTP/1.0": b"POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n0\r\n\r\n",
    "CL + TE": b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "duplicate CL": b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
    "CL 1_0": b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1_0\r\n\r\n0123456789",
    "CL +2": b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\nxx",
    "header block 64 KiB": b"GET /x HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 65536 + b"\r\n\r\n",
}


def bare_app() -> Any:
    """The bare Falcon route every candidate serves."""
    import falcon

    class Thing:
        def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
            resp.media = {"externalId": "bench-0", "phase": "Ready"}

        def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
            req.bounded_stream.read()
            resp.media = {"ok": True}

    app = falcon.App()
    app.add_route("/x", Thing())
    app.add_route("/healthz", Thing())
    return app


app = bare_app()  # granian imports it as bench.front_door:app


# -- candidates --------------------------------------------------------------------------------------


def serve_ours(cert: Path, key: Path, port: int) -> Callable[[], None]:
    from api.server import ApiServer, FrontDoorOptions

    server = ApiServer(app, "127.0.0.1", port, cert, key, options=FrontDoorOptions(threads=16)).start()
    return server.stop


def serve_cheroot(cert: Path, key: Path, port: int) -> Callable[[], None]:
    from cheroot import wsgi
    from cheroot.ssl.builtin import BuiltinSSLAdapter

    class Adapter(BuiltinSSLAdapter):
        def wrap(self, sock: Any) -> Any:
            sock.settimeout(5.0)
            return BuiltinSSLAdapter.wrap(self, sock)

    server = wsgi.Server(
        ("127.0.0.1", port), app, numthreads=16, max=16, timeout=15, accepted_queue_size=64, accepted_queue_timeout=1
    )
    server.ssl_adapter = Adapter(str(cert), str(key))
    server.ssl_adapter.context.minimum_version = ssl.TLSVersion.TLSv1_2
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    stop: Callable[[], None] = server.stop
    return stop


def serve_uvicorn(cert: Path, key: Path, port: int) -> Callable[[], None]:
    import uvicorn
    from a2wsgi import WSGIMiddleware

    config = uvicorn.Config(
        WSGIMiddleware(app, workers=16),
        host="127.0.0.1",
        port=port,
        http="h11",
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait_port(port)

    def stop() -> None:
        server.should_exit = True
        thread.join(10)

    return stop


def serve_granian(cert: Path, key: Path, port: int) -> Callable[[], None]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "granian",
            "--interface",
            "wsgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--blocking-threads",
            "16",
            "--http",
            "1",
            "--http1-header-read-timeout",
            "10000",
            "--ssl-certificate",
            str(cert),
            "--ssl-keyfile",
            str(key),
            "--log-level",
            "warning",
            "bench.front_door:app",
        ],
    )
    _wait_port(port)

    def stop() -> None:
        process.terminate()
        process.wait(10)

    return stop


CANDIDATES = {"ours": serve_ours, "cheroot": serve_cheroot, "uvicorn": serve_uvicorn, "granian": serve_granian}


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


# -- clients and attacks -------------------------------------------------------------------------------


def legit(port: int, ca: Path, seconds: float, path: str = "/healthz", token: str | None = None) -> dict[str, Any]:
    """New TLS connection per GET, 3 s timeout, back to back for `seconds`."""
    context = ssl.create_default_context(cafile=str(ca))
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode() + auth + b"\r\n"
    ok, failed, latencies = 0, 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=3) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
            ):
                tls.sendall(request)
                data = b""
                while chunk := tls.recv(65536):
                    data += chunk
            if data.startswith(b"HTTP/1.1 200"):
                ok += 1
                latencies.append(time.monotonic() - started)
            else:
                failed += 1
        except (OSError, ssl.SSLError):
            failed += 1
    return {"ok": ok, "failed": failed, "latencies": latencies}


def framing(port: int, ca: Path) -> dict[str, str]:
    """Each case: the status line answered, and whether the connection was closed after it."""
    context = ssl.create_default_context(cafile=str(ca))
    results = {}
    for name, payload in FRAMING_CASES.items():
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
            ):
                tls.sendall(payload + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                data, closed = b"", True
                try:
                    while chunk := tls.recv(65536):
                        data += chunk
                except TimeoutError:
                    closed = False
                except (ConnectionResetError, ssl.SSLError):
                    pass
            statuses = [line.split(b" ")[1].decode() for line in data.split(b"\r\n") if line.startswith(b"HTTP/1.")]
            results[name] = f"{'/'.join(statuses) or '-'}{' closed' if closed else ' open'}"
        except (OSError, ssl.SSLError) as exc:
            results[name] = type(exc).__name__
    return results


def cbc_refused(port: int, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers("ECDHE+AES+SHA1:ECDHE+AES+SHA256:ECDHE+AES+SHA384:!AESGCM:!AESCCM")
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return False
    except ssl.SSLError:
        return True


# -- the real manager under attack -------------------------------------------------------------------


class Attack(TypedDict, total=False):
    """How many hostile connections of each kind an attack holds (HostileClients' keywords)."""

    chunks: int
    idle: int


ATTACKS: dict[str, Attack] = {"chunk": {"chunks": 50}, "idle TLS": {"idle": 400}}
SOURCES = tuple(f"127.0.0.{n}" for n in range(2, 10))
THROUGHPUT_TARGET, P99_TARGET = 0.8, 2.0


def run_attacker(kind: str, port: int, seconds: float) -> None:
    """In the attacker process: the attack until `seconds` pass."""
    from harness.attacks import HostileClients

    with HostileClients(port, **ATTACKS[kind], sources=SOURCES, max_seconds=seconds) as attack:
        time.sleep(seconds)
    print(f"{kind}: {attack.opened} connections opened", file=sys.stderr)


def ended_connections(metrics: str) -> float:
    """Connections the server refused, dropped or answered in its own name so far (the attackers' ends)."""
    from bench.common import metric_sum

    return sum(
        metric_sum(metrics, name)
        for name in (
            "dbprovider_api_connections_refused_total",
            "dbprovider_api_connections_dropped_total",
            "dbprovider_api_requests_refused_total",
        )
    )


def attacked(
    port: int, ca: Path, token: str, seconds: float, kind: str | None, server: int, metrics: Callable[[], str]
) -> dict[str, Any]:
    """The legitimate client for `seconds`, alone or with attack `kind` running in its own process;
    with the server's (pid `server`) and the attacker's CPU seconds meanwhile, and how many connections
    the server refused or dropped (from its metrics)."""
    import psutil

    process = psutil.Process(server)

    def measured(attacker: Any = None) -> dict[str, Any]:
        before, ended = sum(process.cpu_times()[:2]), ended_connections(metrics())
        attacker_before = sum(attacker.cpu_times()[:2]) if attacker is not None else 0.0
        run = legit(port, ca, seconds, "/v1/databases", token)
        run["server_cpu"] = sum(process.cpu_times()[:2]) - before
        run["attacker_cpu"] = sum(attacker.cpu_times()[:2]) - attacker_before if attacker is not None else 0.0
        run["ended"] = ended_connections(metrics()) - ended
        return run

    if kind is None:
        return measured()
    argv = [
        sys.executable,
        "-m",
        "bench.front_door",
        "--attacker",
        kind,
        "--port",
        str(port),
        "--seconds",
        str(seconds + 4),
    ]
    attacker = subprocess.Popen(["nice", "-n", "10", *argv], cwd=Path(__file__).resolve().parents[1])
    try:
        time.sleep(3)  # the attackers connect
        return measured(psutil.Process(attacker.pid))
    finally:
        attacker.terminate()
        attacker.wait(30)


MEMORY_KINDS = ("idle TLS", "mid-handshake", "mid-body 8 KiB", "mid-body 22 KiB")


def open_connections(kind: str, port: int, ca: Path, count: int) -> list[Any]:
    """`count` connections held in state `kind`, spread over 8 source addresses."""
    context = ssl.create_default_context(cafile=str(ca))
    held: list[Any] = []
    for n in range(count):
        raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(SOURCES[n % 8], 0))
        if kind == "mid-handshake":  # the ClientHello sent, the server's answer never read
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            client = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
            try:
                client.do_handshake()
            except ssl.SSLWantReadError:
                pass
            raw.sendall(outgoing.read())
            held.append((raw, client))
            continue
        tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
        if kind.startswith("mid-body"):  # most of a body sent: 8 KiB of 16 KiB, or 22 KiB of the 24 KiB limit
            sent, declared = (8 * 1024, 16 * 1024) if kind == "mid-body 8 KiB" else (22 * 1024, 24 * 1024)
            tls.sendall(
                b"PUT /v1/databases/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % declared + b" " * sent
            )
        held.append(tls)
    return held


def memory_per_connection(stack: Any, count: int) -> dict[str, float]:
    """RSS growth per connection of each kind, in KiB, each kind on a fresh manager (memory freed by one
    kind would otherwise be reused by the next and hide its cost)."""
    import psutil

    from bench.common import ManagerProcess, wait_for

    figures = {}
    for n, kind in enumerate(MEMORY_KINDS):
        manager = ManagerProcess(stack, name=f"bench-memory-{n}")
        try:
            wait_for(manager.ready, 120, "manager /readyz", 0.2)
            time.sleep(3)
            process = psutil.Process(manager.pid)
            before = process.memory_info().rss
            started = time.monotonic()
            held = open_connections(kind, manager.api_port, stack.dev.ca_file, count)
            time.sleep(1.5)
            after = process.memory_info().rss
            if time.monotonic() - started > 9:
                print(f"WARNING: opening {count} {kind} connections took longer than the header deadline")
            figures[kind] = (after - before) / count / 1024
            for item in held:
                (item[0] if isinstance(item, tuple) else item).close()
        finally:
            manager.stop()
    return figures


def parser_figures(rounds: int = 5) -> list[list[str]]:
    """Microseconds to frame a typical PUT (headers and a JSON body) and a body of 256 one-byte chunks,
    with our parser, h11 and llhttp (httptools), each fed what one TLS record holds (16 KiB)."""
    import h11
    import httptools

    from api.http1 import RequestParser

    put = (
        b"PUT /v1/databases/orders HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer "
        + b"a" * 64
        + b"\r\nContent-Type: application/json\r\nContent-Length: 22\r\nUser-Agent: bench\r\n\r\n"
        + b'{"sizeClass": "small"}'
    )
    chunked = (
        b"PUT /v1/databases/orders HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"1\r\nx\r\n" * 256
        + b"0\r\n\r\n"
    )

    def ours(data: bytes) -> None:
        parser = RequestParser(16384, 65536, max_chunks=1024)
        for i in range(0, len(data), 16384):
            parser.feed(data[i : i + 16384])
            if parser.head() is not None and parser.body() is not None:
                return
        raise AssertionError("not framed")

    def with_h11(data: bytes) -> None:
        connection = h11.Connection(h11.SERVER)
        connection.receive_data(data)
        while not isinstance(connection.next_event(), h11.EndOfMessage):
            pass

    class Sink:
        done = False

        def on_message_complete(self) -> None:
            self.done = True

    def with_llhttp(data: bytes) -> None:
        sink = Sink()
        httptools.HttpRequestParser(sink).feed_data(data)
        assert sink.done

    rows = []
    for name, frame in (("ours (api/http1.py)", ours), ("h11 0.16", with_h11), ("llhttp (httptools 0.9)", with_llhttp)):
        cells = [name]
        for data, count in ((put, 2000), (chunked, 200)):
            best = min(_timed(frame, data, count) for _ in range(rounds))
            cells.append(f"{best * 1e6:.1f}")
        rows.append(cells)
    return rows


def _timed(frame: Callable[[bytes], None], data: bytes, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        frame(data)
    return (time.perf_counter() - started) / count


def probes_and_deadline(cert: Path, key: Path, ca: Path) -> list[list[str]]:
    """Busy workers must not starve the probes: 40 clients on a handler that takes 2 s keep all 16 workers
    busy; how long do /healthz and /readyz take meanwhile, and when does a handler stuck for 60 s get its 503?"""
    import threading

    import falcon

    from api.server import ApiServer, FrontDoorOptions
    from harness.process import free_port

    class Slow:
        def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
            time.sleep(float(req.get_param("s") or 2))
            resp.media = {"ok": True}

    class Probe:
        def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
            resp.media = {"status": "ok"}

    slow_app = falcon.App()
    slow_app.add_route("/slow", Slow())
    slow_app.add_route("/healthz", Probe())
    slow_app.add_route("/readyz", Probe())
    port = free_port()
    server = ApiServer(slow_app, "127.0.0.1", port, cert, key, options=FrontDoorOptions(threads=16)).start()
    context = ssl.create_default_context(cafile=str(ca))
    stop = threading.Event()

    def get(path: str, timeout: float) -> tuple[int, float]:
        started = time.monotonic()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
        return int(data[9:12]), time.monotonic() - started

    def client() -> None:
        while not stop.is_set():
            try:
                get("/slow?s=2", 30)
            except OSError:
                pass

    clients = [threading.Thread(target=client, daemon=True) for _ in range(40)]
    try:
        for thread in clients:
            thread.start()
        time.sleep(3)
        probes = [get(path, 3) for _ in range(10) for path in ("/healthz", "/readyz")]
        stuck = get("/slow?s=60", 30)
    finally:
        stop.set()
        server.stop()
    worst = max(seconds for _, seconds in probes)
    ok = sum(1 for status, _ in probes if status == 200)
    return [
        [
            "/healthz and /readyz while 40 clients keep the 16 workers busy with 2 s requests",
            f"{ok} of {len(probes)} answered 200, slowest {worst * 1000:.0f} ms (kubelet timeout 3 s)",
        ],
        ["a handler stuck for 60 s (api.requestTimeout 10 s)", f"answered {stuck[0]} after {stuck[1]:.1f} s"],
    ]


def manager_run(args: argparse.Namespace, argv: list[str] | None) -> int:
    from bench.common import ManagerProcess, ResultsFiles, Stack, Target, log, report_targets
    from domain.settings import SETTINGS
    from harness.certs import CertificateAuthority

    parts = set(args.parts.split(","))
    print(f"machine: {machine_line()}")
    table(
        "parsers: microseconds to frame one request (best of 5 rounds)",
        parser_figures(),
        ["parser", "PUT with a JSON body", "256 one-byte chunks"],
    )
    if "probes" in parts:
        bench_ca = CertificateAuthority(Path(tempfile.mkdtemp(prefix="front-door-")), "bench")
        bench_cert = bench_ca.issue_server("bench")
        log("probes and the request deadline, on a bare app")
        table(
            "probes and the request deadline (a bare app with the front door's defaults)",
            probes_and_deadline(bench_cert.cert_file, bench_cert.key_file, bench_ca.ca_file),
            ["case", "figure"],
        )
    stack = Stack("front-door")
    manager = None
    targets = []
    try:
        stack.start_dev()
        if "memory" in parts:
            log(f"memory per connection ({args.connections} of each kind, each on a fresh manager)")
            memory = memory_per_connection(stack, args.connections)
            table("manager RSS per connection", [[k, f"{v:.1f} KiB"] for k, v in memory.items()], ["kind", "RSS"])
            worst, per = max(memory.values()) * 1024, SETTINGS.pod.connection_bytes
            budget, default_max = SETTINGS.pod.connections_bytes, stack.dev.config.api.max_connections
            targets.append(
                Target(
                    f"worst connection {worst / 1024:.0f} KiB measured, {per / 1024:.0f} KiB assumed "
                    "by the install config check",
                    f"<= {per / 1024:.0f} KiB (the install config's assumption)",
                    worst <= per,
                    key="memory-per-connection",
                    what="the manager's RSS per connection, the worst kind",
                    value=worst / 1024,
                    unit="KiB",
                )
            )
            needed = default_max * worst
            targets.append(
                Target(
                    f"maxConnections {default_max} x {worst / 1024:.0f} KiB = {needed / 2**20:.0f} MiB",
                    f"<= {budget / 2**20:.0f} MiB (pod limit less the manager)",
                    needed <= budget,
                    key="connections-memory",
                    what="api.maxConnections connections of the worst kind",
                    value=needed / 2**20,
                    unit="MiB",
                )
            )
        if "attacks" in parts:
            manager = ManagerProcess(stack)
            manager.wait_leading(stack.admin_rest())
            targets += attack_ratios(args, manager, stack.dev.ca_file, stack.dev.token)
        report_targets(targets, ResultsFiles.of("bench.front_door", args, argv))
    finally:
        stack.close(manager)
    return 0


def attack_ratios(args: argparse.Namespace, manager: Any, ca: Path, token: str) -> list[Any]:
    """Rounds of alone / attacked / alone per attack; the medians of the ratios as target lines."""
    from bench.common import Target, log

    port, server = manager.api_port, manager.pid

    kinds = [kind for kind in ATTACKS if kind in args.attacks.split(",")]
    rows: list[list[Any]] = []
    ratios: dict[str, dict[str, list[float]]] = {kind: {"throughput": [], "p99": []} for kind in kinds}
    for n in range(args.rounds):
        for kind in kinds:
            log(f"round {n}: alone, then under the {kind} attack, then alone")
            runs = [attacked(port, ca, token, args.seconds, k, server, manager.metrics) for k in (None, kind, None)]
            alone_rate = statistics.mean(r["ok"] for r in (runs[0], runs[2])) / args.seconds
            alone_p99 = statistics.mean(percentile(r["latencies"], 99) for r in (runs[0], runs[2]))
            hostile = runs[1]
            rate = hostile["ok"] / args.seconds
            p99 = percentile(hostile["latencies"], 99) if hostile["latencies"] else float("inf")
            ratios[kind]["throughput"].append(rate / alone_rate)
            ratios[kind]["p99"].append(p99 / alone_p99)
            alone_cpu = statistics.mean(100 * r["server_cpu"] / args.seconds for r in (runs[0], runs[2]))
            rows.append(
                [
                    n,
                    kind,
                    f"{alone_rate:.1f}",
                    f"{rate:.1f}",
                    hostile["failed"],
                    f"{alone_p99 * 1000:.0f}",
                    f"{p99 * 1000:.0f}",
                    f"{rate / alone_rate:.2f}x",
                    f"{p99 / alone_p99:.2f}x",
                    f"{alone_cpu:.0f}% / {100 * hostile['server_cpu'] / args.seconds:.0f}%",
                    f"{100 * hostile['attacker_cpu'] / args.seconds:.0f}%",
                    f"{hostile['ended'] / args.seconds:.1f}",
                    f"{os.getloadavg()[0]:.1f}",
                ]
            )
    table(
        "legitimate authenticated GETs, a new TLS connection each (alone = mean of the runs before and after)",
        rows,
        [
            "round",
            "attack",
            "alone/s",
            "attacked/s",
            "failed",
            "alone p99 ms",
            "attacked p99 ms",
            "throughput",
            "p99",
            "server CPU alone / attacked",
            "attacker CPU",
            "refused+dropped/s",
            "load",
        ],
    )
    targets = []
    for kind, figures in ratios.items():
        throughput, p99 = statistics.median(figures["throughput"]), statistics.median(figures["p99"])
        slug = kind.lower().replace(" ", "-")
        targets.append(
            Target(
                f"{kind} attack: legitimate throughput {throughput:.2f}x of alone",
                f">= {THROUGHPUT_TARGET}x",
                throughput >= THROUGHPUT_TARGET,
                key=f"{slug}-throughput",
                what=f"authenticated GETs on new connections under the {kind} attack, over alone (throughput)",
                value=throughput,
                unit="x",
            )
        )
        targets.append(
            Target(
                f"{kind} attack: legitimate p99 {p99:.2f}x of alone",
                f"<= {P99_TARGET}x",
                p99 <= P99_TARGET,
                key=f"{slug}-p99",
                what=f"authenticated GETs on new connections under the {kind} attack, over alone (p99)",
                value=p99,
                unit="x",
            )
        )
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=None, help="per phase (default 10; --compare: 20)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=300, help="per kind, for the memory figures")
    parser.add_argument("--parts", default="probes,memory,attacks", help="of the default run (comma-separated)")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="of the attacks part (comma-separated)")
    parser.add_argument("--compare", action="store_true", help="compare the candidate servers instead")
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--attacker", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attacker:
        run_attacker(args.attacker, args.port, args.seconds)
        return 0
    if not args.compare:
        args.seconds = args.seconds or 10.0
        return manager_run(args, argv)
    args.seconds = args.seconds or 20.0
    from harness.attacks import HostileClients
    from harness.certs import CertificateAuthority
    from harness.process import free_port

    print(f"machine: {machine_line()}")
    workdir = Path(tempfile.mkdtemp(prefix="front-door-"))
    ca = CertificateAuthority(workdir, "bench")
    cert = ca.issue_server("bench")
    rows = []
    framing_rows = []
    for name in args.candidates.split(","):
        port = free_port()
        stop = CANDIDATES[name](cert.cert_file, cert.key_file, port)
        try:
            quiet = legit(port, ca.ca_file, args.seconds / 4)
            attackers = HostileClients(port, silent=8, slow=16, idle=20, byte_every=2.0, max_seconds=args.seconds + 30)
            with attackers as attack:
                time.sleep(2)  # the attackers connect
                hostile = legit(port, ca.ca_file, args.seconds)
            cases = framing(port, ca.ca_file)
            refused = cbc_refused(port, ca.ca_file)
        finally:
            stop()
        for label, run in (("alone", quiet), ("under attack", hostile)):
            lat = run["latencies"]
            rows.append(
                [
                    name,
                    label,
                    run["ok"],
                    run["failed"],
                    f"{percentile(lat, 50) * 1000:.0f}" if lat else "-",
                    f"{percentile(lat, 99) * 1000:.0f}" if lat else "-",
                    attack.opened if label == "under attack" else "",
                ]
            )
        framing_rows.append([name, *cases.values(), "refused" if refused else "ACCEPTED"])
    table(
        "legitimate GETs, a new TLS connection each, 3 s timeout",
        rows,
        ["server", "run", "ok", "failed", "p50 ms", "p99 ms", "attack connections opened"],
    )
    table(
        "framing (status answered, connection state) and TLS 1.2 CBC",
        framing_rows,
        ["server", *FRAMING_CASES, "CBC on 1.2"],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
