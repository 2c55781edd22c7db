"""Child processes that cannot outlive the harness, and free loopback ports."""

from __future__ import annotations

import ctypes
import fcntl
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# Set by `make test-fast` (and inherited by every child process it starts, such as a `dbprovider dev`
# under test): the inner loop runs only tests that need no server, and one that starts one anyway fails
# loudly here instead of quietly making the fast tier slow.
NO_SERVERS_ENV = "DBPROVIDER_TEST_NO_SERVERS"
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


LATE_BUILDS = Path(__file__).resolve().parent.parent / "build" / "late"


class LateBuildFailed(RuntimeError):
    """A build hack/late-builds.sh ran in the background failed: the suite that needs it cannot run."""


def wait_for_late_build(name: str, argv: list[str]) -> None:
    """If hack/late-builds.sh has `name` pending or running in the background, run its build script
    (`argv`) now: the script's lock makes this wait for the background build, whose cache then answers
    at once (or this builds it, if the background has not got there yet). A failed one raises, with the
    end of its log, instead of building for half an hour again."""
    status_file = LATE_BUILDS / f"{name}.status"
    status = status_file.read_text().strip() if status_file.exists() else ""
    if status in ("pending", "running"):
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            raise LateBuildFailed(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    elif status.startswith("failed"):
        log = LATE_BUILDS / f"{name}.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""
        raise LateBuildFailed(f"the background build `{name}` of hack/late-builds.sh {status}; {log} ends:\n{tail}")


def wait_for_background_builds(names: Iterable[str], state: Path = LATE_BUILDS, poll: float = 2.0) -> None:
    """Block while hack/late-builds.sh's background runner still has one of `names` pending or running.

    Unbounded on purpose: a cold build takes what the machine takes (the Pulumi CLI about half an hour on
    2 cores), so tests/conftest.py calls this before pytest-timeout starts a test's clock. Returns at once
    when no background runner holds its lock (none started, or it died): `wait_for_late_build` then builds
    or reports the failure itself.
    """
    while any(_status(state, name) in ("pending", "running") for name in names) and _runner_alive(state):
        time.sleep(poll)


def _status(state: Path, name: str) -> str:
    status_file = state / f"{name}.status"
    return status_file.read_text().strip() if status_file.exists() else ""


def _runner_alive(state: Path) -> bool:
    """True while the background runner holds runner.lock (hack/late-builds.sh --background)."""
    lock = state / "runner.lock"
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the lock if this process got it
    return False


def built_dir(build_script: Path, override_env: str, *args: str, late: str | None = None) -> Path:
    """The cache folder a hack/build-*.sh script puts its pinned binaries in (`<script> [args] --dir`),
    or the folder the environment variable `override_env` names. `late`: the name under which
    hack/late-builds.sh may be building it in the background (waited for, see wait_for_late_build)."""
    override = os.environ.get(override_env)
    if override:
        return Path(override)
    if late is not None:
        wait_for_late_build(late, ["bash", str(build_script), *args])
    argv = ["bash", str(build_script), *args, "--dir"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


# Ports handed to servers that bind them later. The kernel's own choice (bind to port 0) comes from the
# ephemeral range, which every outgoing connection on the machine also draws from: between our check and
# the server's bind, a client socket could take it ("Address already in use", seen with two xdist
# workers). So the ports come from below that range, and each is claimed with a lock file that this
# process holds until it exits, so concurrent test processes never pick the same one.
_PORT_RANGE = (20000, 32000)
_PORT_LOCKS = Path(os.environ.get("TMPDIR", "/tmp")) / "dbprovider-ports"
_claimed: dict[int, int] = {}  # port -> fd of its lock file, held for the life of this process


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, outside the ephemeral range, and claimed by this process."""
    _PORT_LOCKS.mkdir(mode=0o777, exist_ok=True)
    for _ in range(1000):
        port = random.randrange(*_PORT_RANGE)
        if port in _claimed:
            continue
        fd = os.open(_PORT_LOCKS / str(port), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # another test process holds it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                os.close(fd)
                continue  # something outside our runs listens there
        _claimed[port] = fd
        return port
    raise RuntimeError(f"no free port in {_PORT_RANGE} after 1000 tries")


def wait_for_port(
    port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None
) -> None:
    """Poll until something listens on 127.0.0.1:port; fail early if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening{_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f}s{_tail(log)}")


def _tail(log: Path | None, lines: int = 30) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return "\n--- last lines of " + str(log) + " ---\n" + "\n".join(text)


def spawn(
    argv: list[str],
    log: Path,
    death_signal: int = signal.SIGTERM,
    user: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start argv with output to `log`; the kernel signals it if this process dies, so no leftovers."""
    if os.environ.get(NO_SERVERS_ENV):
        raise RuntimeError(
            f"{Path(argv[0]).name} started in a run without servers ({NO_SERVERS_ENV} is set, as `make test-fast` "
            "does): mark the test `server` (pytest.mark.server), or use a server fixture (kube, postgres), "
            "which marks it"
        )

    def _die_with_parent() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, death_signal)

    out = open(log, "ab")  # handed to the child, closed below
    try:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
            start_new_session=True,
            user=user,
            env=env,
        )
    finally:
        out.close()


def stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    """Signal the process group, wait, then kill whatever is left."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout)
