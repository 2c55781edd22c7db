"""A TCP proxy that adds a fixed delay each way: a shard in another zone, on loopback.

    proxy = LatencyProxy({5432: 15432}, delay=0.010, log=Path("proxy.log")).start()
    proxy.port_of(5432)   # connect here instead of 5432: every byte arrives 10 ms later, both ways
    proxy.stop()

One child process (asyncio, bound to its parent like every harness process) serves every route, so
the benchmark's own process and the manager share the proxy's cost alike. Bytes keep their order;
each chunk read is written `delay` seconds after it arrived, so a request/answer round trip costs
2 x delay on top of the real one, whatever the chunk sizes. A closed side closes the other one.
It does not parse what it forwards (TLS passes through). Run as a module, it is that child:

    python -m harness.latency_proxy --delay 0.010 LISTEN_PORT:TARGET_PORT ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from harness.process import free_port, spawn, stop, wait_for_port

CHUNK = 65536


class LatencyProxy:
    """The parent's handle: routes target port -> listening port, started in one child process."""

    def __init__(self, targets: list[int], delay: float, log: Path, host: str = "127.0.0.1") -> None:
        self.delay = delay
        self.log = log
        self.host = host
        self.routes = {target: free_port() for target in targets}
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> LatencyProxy:
        argv = [sys.executable, "-m", "harness.latency_proxy", "--delay", str(self.delay), "--host", self.host]
        argv += [f"{listen}:{target}" for target, listen in self.routes.items()]
        self._proc = spawn(argv, self.log, env=None)
        for listen in self.routes.values():
            wait_for_port(listen, timeout, self._proc, self.log)
        return self

    def port_of(self, target: int) -> int:
        return self.routes[target]

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def stop(self) -> None:
        stop(self._proc)
        self._proc = None


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader to writer, each chunk `delay` seconds after it was read, in order."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        try:
            while data := await reader.read(CHUNK):
                chunks.put_nowait((loop.time() + delay, data))
        except OSError:
            pass
        chunks.put_nowait((loop.time() + delay, b""))

    reading = asyncio.ensure_future(read())
    try:
        while True:
            due, data = await chunks.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        reading.cancel()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _serve(host: str, routes: dict[int, int], delay: float) -> None:
    async def handle(target: int, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(host, target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_forward(client_r, server_w, delay), _forward(server_r, client_w, delay))

    def handler(target: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        return lambda client_r, client_w: handle(target, client_r, client_w)

    servers = [
        await asyncio.start_server(handler(target), host, listen, backlog=512) for listen, target in routes.items()
    ]
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    await stopped.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay", type=float, required=True, help="seconds added each way")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("routes", nargs="+", help="LISTEN_PORT:TARGET_PORT")
    args = parser.parse_args(argv)
    routes = {int(listen): int(target) for listen, target in (r.split(":") for r in args.routes)}
    asyncio.run(_serve(args.host, routes, args.delay))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
