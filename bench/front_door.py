"""Choosing the API's server by measurement: each candidate serves the same bare Falcon app over TLS
while the attacks of issue 14 run, and a legitimate client makes requests beside them.

    python -m bench.front_door [--seconds 20] [--candidates ours,cheroot,uvicorn,granian]

Candidates: `ours` (api/server.py: asyncio front door, strict framing), `cheroot` (the server before
it: 16 threads, 15 s socket timeout, 5 s handshake timeout on the accepting thread), `uvicorn` (h11,
the WSGI app through a2wsgi on 16 threads; the measurement needs `pip install uvicorn a2wsgi`) and
`granian` (Rust/hyper, WSGI, 1 worker with 16 blocking threads, header read timeout 10 s; needs
`pip install granian`). Neither uvicorn nor granian is a dependency of the product.

Per candidate: a legitimate client opens a new TLS connection per GET, as a kubelet probe does (3 s
timeout), alone for `--seconds`/4, then with the attack for `--seconds`: 8 silent TCP sockets,
16 TLS connections sending their headers one byte every 2 s, and 20 TLS connections idle after the
handshake, each reopened when the server drops it. Then the framing cases of the issue (answered 400
and closed?) and a TLS 1.2 CBC-only client (refused?).
"""

from __future__ import annotations

import argparse
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import machine_line, percentile, table

FRAMING_CASES = {
    "TE on HTTP/1.0": b"POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
    b"0\r\n\r\n",
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
    from api.server import ApiServer

    server = ApiServer(app, "127.0.0.1", port, cert, key, threads=16).start()
    return server.stop


def serve_cheroot(cert: Path, key: Path, port: int) -> Callable[[], None]:
    from cheroot import wsgi
    from cheroot.ssl.builtin import BuiltinSSLAdapter

    class Adapter(BuiltinSSLAdapter):
        def wrap(self, sock: Any) -> Any:
            sock.settimeout(5.0)
            return super().wrap(sock)

    server = wsgi.Server(("127.0.0.1", port), app, numthreads=16, max=16, timeout=15, accepted_queue_size=64,
                         accepted_queue_timeout=1)
    server.ssl_adapter = Adapter(str(cert), str(key))
    server.ssl_adapter.context.minimum_version = ssl.TLSVersion.TLSv1_2
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    return server.stop


def serve_uvicorn(cert: Path, key: Path, port: int) -> Callable[[], None]:
    import uvicorn
    from a2wsgi import WSGIMiddleware

    config = uvicorn.Config(WSGIMiddleware(app, workers=16), host="127.0.0.1", port=port, http="h11",
                            ssl_certfile=str(cert), ssl_keyfile=str(key), log_level="warning", lifespan="off")
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
        [sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--blocking-threads", "16", "--http", "1", "--http1-header-read-timeout", "10000",
         "--ssl-certificate", str(cert), "--ssl-keyfile", str(key), "--log-level", "warning",
         "bench.front_door:app"],
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


def legit(port: int, ca: Path, seconds: float) -> dict[str, Any]:
    """New TLS connection per GET, 3 s timeout, back to back for `seconds`."""
    context = ssl.create_default_context(cafile=str(ca))
    ok, failed, latencies = 0, 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=3) as raw, context.wrap_socket(
                raw, server_hostname="127.0.0.1"
            ) as tls:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
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
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(
                raw, server_hostname="127.0.0.1"
            ) as tls:
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
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(
            raw, server_hostname="127.0.0.1"
        ):
            return False
    except ssl.SSLError:
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    args = parser.parse_args(argv)
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
            rows.append([name, label, run["ok"], run["failed"],
                         f"{percentile(lat, 50) * 1000:.0f}" if lat else "-",
                         f"{percentile(lat, 99) * 1000:.0f}" if lat else "-",
                         attack.opened if label == "under attack" else ""])
        framing_rows.append([name, *cases.values(), "refused" if refused else "ACCEPTED"])
    table("legitimate GETs, a new TLS connection each, 3 s timeout", rows,
          ["server", "run", "ok", "failed", "p50 ms", "p99 ms", "attack connections opened"])
    table("framing (status answered, connection state) and TLS 1.2 CBC", framing_rows,
          ["server", *FRAMING_CASES, "CBC on 1.2"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
