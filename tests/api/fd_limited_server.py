"""An ApiServer in a process of its own with few file descriptors left, for tests/api/test_front_door.py.

    python -m tests.api.fd_limited_server CERT KEY HEADROOM    # prints the port; serves until stdin closes

HEADROOM descriptors above those open after start: accept() fails with EMFILE once that many are used.
"""

from __future__ import annotations

import logging
import os
import resource
import sys

import falcon

from api.server import ApiServer, FrontDoorOptions


class Ok:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"status": "ok"}


def main() -> None:
    cert, key, headroom = sys.argv[1], sys.argv[2], int(sys.argv[3])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    app = falcon.App()
    app.add_route("/healthz", Ok())
    server = ApiServer(app, "127.0.0.1", 0, cert, key, options=FrontDoorOptions(max_connections=1000)).start()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + headroom, hard))
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
