"""The harness' one-node Kubernetes (harness/node.py) runs real pods and leaves the host as it found it:
no interface, route, iptables rule, sysctl, mount or cgroup of its own outside its namespaces, and
nothing left running, whether it is closed or the test run that started it is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from harness.images import build_image
from harness.kube import pinned_kube_version
from harness.node import KUBELET_SYSCTLS, NODE_NAME, KubeNode, _node_cgroup_name
from tests.support.common import wait_for

REPO = Path(__file__).resolve().parents[2]
WATCHED_SYSCTLS = (*KUBELET_SYSCTLS, "net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables")


def host_state() -> dict[str, Any]:
    """What a node must not change on the host (read from the host's namespaces)."""

    def out(*argv: str) -> list[str]:
        return sorted(subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines())

    return {
        "links": [line.split(":")[1].strip().split("@")[0] for line in out("ip", "-o", "link", "show")],
        "addresses": out("ip", "-o", "addr", "show"),
        "routes": out("ip", "route", "show", "table", "all"),
        "iptables": [rule for table in ("filter", "nat", "mangle") for rule in out("iptables", "-t", table, "-S")],
        "sysctls": {key: Path(f"/proc/sys/{key}").read_text().strip() for key in WATCHED_SYSCTLS},
    }


def node_mounts(node: KubeNode) -> list[str]:
    """Mount points of the host's mount namespace that belong to a node."""
    marks = (str(node.workdir), "/run/containerd", "/run/netns", "/var/lib/kubelet")
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if any(m in line for m in marks)]


def run_pod(node: KubeNode, name: str) -> None:
    pause = build_image(pause=True)
    created = node.kubectl("run", name, f"--image={pause.tag}", "--image-pull-policy=Never", "--restart=Never")
    assert created.returncode == 0, created.stderr
    waited = node.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s", timeout=150)
    assert waited.returncode == 0, waited.stderr + node.kubectl("describe", "pod", name).stdout


@pytest.mark.server  # starts a node of its own
def test_a_killed_test_run_leaves_nothing_running(tmp_path: Path) -> None:
    """The process that started the node is SIGKILLed: every node process and container goes with it."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from harness.node import KubeNode
        from tests.cluster.test_node import run_pod
        node = KubeNode().start()
        run_pod(node, "survivor")
        print(node.mount_namespace, node.cgroup, node.workdir, node.init_pid, flush=True)
        time.sleep(600)
    """)
    errors = tmp_path / "stderr"
    with errors.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True
        )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, f"the node did not start: {errors.read_text()[-3000:]}"
        mount_namespace, cgroup, workdir, init_pid = line.split()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def inside() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "ns" / "mnt") == mount_namespace:
                        found.append(int(entry.name))
                except OSError:
                    pass
        return found

    pids = Path("/sys/fs/cgroup/pids") / cgroup.lstrip("/")

    def in_cgroups() -> list[str]:  # the containers (each in a mount namespace of its own) included
        return [p for procs in pids.rglob("cgroup.procs") for p in procs.read_text().split()]

    def init_gone() -> bool:  # the namespaces' init exits last, once the kernel has killed the rest
        return _node_cgroup_name(int(init_pid)) != cgroup.rsplit("/", 1)[1]

    wait_for(
        lambda: not inside() and not in_cgroups() and init_gone(),
        timeout=30,
        what="every process of the killed node gone",
    )
    # The next node removes the empty cgroups a killed run left; the test removes its files.
    subprocess.run(["rm", "-rf", workdir], check=False)
    with KubeNode():
        assert not [h for h in Path("/sys/fs/cgroup").iterdir() if (h / cgroup.lstrip("/")).exists()]


@pytest.mark.server  # starts a node of its own
def test_the_node_changes_nothing_on_the_host_and_cleans_up() -> None:
    before = host_state()
    node = KubeNode()
    started = time.monotonic()
    try:
        node.start()
        up = time.monotonic() - started
        with node.admin_client() as client:
            version = kubernetes.client.CoreV1Api(client).read_node(NODE_NAME).status.node_info.kubelet_version
        assert version == pinned_kube_version()  # one pin: hack/kube/go.mod builds the apiserver and the node
        run_pod(node, "pause")
        cgroup = node.cgroup
        during = host_state()
        assert during == before
        assert node_mounts(node) == []
        inside = node.processes_inside()
        assert len(inside) > 8  # etcd, apiserver, ..., shim, pause: all in the node's namespaces
        print(f"node up in {up:.1f}s")
    finally:
        node.close()
    assert node.processes_inside() == []
    assert host_state() == before
    assert not node.workdir.exists()
    assert not [h for h in Path("/sys/fs/cgroup").iterdir() if (h / cgroup.lstrip("/")).exists()]
