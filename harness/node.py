"""A real one-node Kubernetes for tests: pods run from real images, in a namespace of their own.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, containerd (runc, the CNI
bridge) and the kubelet, all built from the pinned k8s.io/kubernetes of hack/kube/go.mod
(`hack/build-kube.sh`, `--node`) or from Debian, plus CoreDNS (`hack/build-coredns.sh`) as cluster DNS.
../shared/real-node.md is the recipe this follows.

The host is left as it was. Everything node-side runs inside one private mount, network and PID
namespace, held by `catatonit` as its init:
- the bridge, the pod range 10.22.0.0/24, the Service range 10.0.0.0/24 and kube-proxy's iptables
  rules exist only in that network namespace (nothing routes them out of it);
- /run is a tmpfs there, and the six host-wide sysctls the kubelet wants to set are bind-mounted
  files there, so it changes none of the host's;
- the pods' cgroups go under this process' own memory cgroup (`dbp-node-<init>` in every hierarchy).
Every process is bound to its parent (harness.process.spawn), and the namespace's init is bound to the
`unshare` that made it (`--kill-child`): if the test run dies, the kernel kills everything in the PID
namespace, containerd's shims and the containers included. `close()` stops it in order and removes
the cgroups and files.

Test code runs on the host and talks to the node through relays (harness.netns): the apiserver through
`self.url` (127.0.0.1, like KubeControlPlane, whose client methods this class inherits), any address
inside through `forward(ip, port)`, and a server on host loopback is offered to pods as a Service
through `expose_service(...)`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml
from kubernetes.client.exceptions import ApiException

from harness.certs import CertFiles, CertificateAuthority, make_rsa_keypair
from harness.images import Image, build_image
from harness.kube import (
    REPO_ROOT,
    KubeControlPlane,
    MissingBinaryError,
    apiserver_command,
    binaries_dir,
    etcd_command,
)
from harness.netns import NetworkNamespace, Relay, forward_in, forward_out
from harness.process import built_dir, spawn, stop

NODE_NAME = "node1"
NODE_IP = "10.22.0.1"  # the CNI bridge: the node's InternalIP and the apiserver's advertised address
POD_CIDR = "10.22.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"  # the first address of the Service range: the `kubernetes` Service
DNS_SERVICE_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
APISERVER_PORT = 6443
DNS_READY_PORT = 8181
BRIDGE = "dbp0"
# The kubelet sets these host-wide sysctls unless they already have its values: it sees files instead.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
NODE_BINARIES = ("kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubectl")
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "catatonit", "iptables", "nsenter", "unshare")
CNI_DIR = Path("/usr/lib/cni")
# Where this harness' own EndpointSlices say they come from (no controller touches them).
MANAGED_BY = "harness.dbprovider"


def node_binaries_dir() -> Path:
    """kubelet & co. for the pinned version (`hack/build-kube.sh --node`; DBPROVIDER_NODE_BIN overrides)."""
    return built_dir(REPO_ROOT / "hack" / "build-kube.sh", "DBPROVIDER_NODE_BIN", "--node", late="node")


def coredns_dir() -> Path:
    """CoreDNS (`hack/build-coredns.sh`; DBPROVIDER_COREDNS_BIN overrides)."""
    return built_dir(REPO_ROOT / "hack" / "build-coredns.sh", "DBPROVIDER_COREDNS_BIN", late="coredns")


@dataclass(frozen=True)
class ExposedService:
    """A host loopback server offered to pods as `<name>.<namespace>.svc:<port>`."""

    namespace: str
    name: str
    port: int
    cluster_ip: str
    relay: Relay

    @property
    def host(self) -> str:
        return f"{self.name}.{self.namespace}.svc"


class KubeNode(KubeControlPlane):
    """A one-node cluster; `start()` returns once the node is Ready and cluster DNS answers."""

    def __init__(self, workdir: Path | None = None) -> None:
        super().__init__(bin_dir=binaries_dir(), workdir=workdir or Path(tempfile.mkdtemp(prefix="dbprovider-node-")))
        self._own_workdir = workdir is None
        self.node_bin = node_binaries_dir()
        self.coredns_bin = coredns_dir()
        missing = [str(self.node_bin / b) for b in NODE_BINARIES if not os.access(self.node_bin / b, os.X_OK)]
        if not os.access(self.coredns_bin / "coredns", os.X_OK):
            missing.append(str(self.coredns_bin / "coredns"))
        missing += [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
        missing += [str(CNI_DIR / p) for p in ("bridge", "host-local") if not (CNI_DIR / p).exists()]
        if missing:
            raise MissingBinaryError(
                f"not found: {', '.join(missing)}. hack/setup.sh installs the Debian packages (containerd, "
                "catatonit, containernetworking-plugins, iptables) and builds the rest "
                "(`bash hack/build-kube.sh --node`, `bash hack/build-coredns.sh`)"
            )
        self._holder: subprocess.Popen[bytes] | None = None
        self.init_pid = 0  # the namespaces' init (catatonit), as the host sees it
        self.mount_namespace = ""  # its mount namespace (`mnt:[inode]`), to find processes left inside
        self.netns: NetworkNamespace | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._relays: list[Relay] = []
        self._forwards: dict[tuple[str, int], int] = {}
        self.cgroup = ""  # this node's cgroup path (the same in every v1 hierarchy)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> KubeNode:
        try:
            for d in ("log", "sysctl", "cni", "cni-ipam", "kubelet", "pod-logs", "containerd"):
                (self.workdir / d).mkdir(parents=True, exist_ok=True)
            self._enter_namespaces()
            self._make_network()
            self._make_cgroups()
            self._start_containerd(timeout)
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
            self._start_node_components()
            self._start_dns(timeout)
            self._wait_node_ready(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the kubelet first (so it restarts nothing), then the rest; the namespaces' init last,
        which makes the kernel kill whatever is left in them (shims, containers)."""
        for name in ("kubelet", "coredns", "kube-proxy", "kube-scheduler", "kube-controller-manager"):
            stop(self._procs.pop(name, None), timeout=10)
        self._kill_cgroup_processes()
        for name in list(self._procs):
            stop(self._procs.pop(name), timeout=5)
        stop(self._apiserver, timeout=5)
        stop(self._etcd, timeout=5)
        self._apiserver = self._etcd = None
        stop(self._holder, timeout=10)
        self._holder = None
        for relay in self._relays:
            relay.close()
        self._relays.clear()
        self._forwards.clear()
        if self.netns is not None:
            self.netns.close()
            self.netns = None
        self._remove_cgroups()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> KubeNode:
        return self.start()

    # -- namespaces, network, cgroups ----------------------------------------------------------

    def _enter_namespaces(self) -> None:
        self._holder = spawn(
            [
                "unshare",
                "--fork",
                "--kill-child",
                "--pid",
                "--mount-proc",
                "--net",
                "--propagation",
                "private",
                "catatonit",
                "-P",
            ],
            self.workdir / "log" / "init.log",
            death_signal=signal.SIGKILL,  # unshare --fork blocks SIGTERM (it passes Ctrl-C to its child)
        )
        children = Path(f"/proc/{self._holder.pid}/task/{self._holder.pid}/children")
        deadline = time.monotonic() + 10
        while not (text := children.read_text().strip() if children.exists() else ""):
            if self._holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"unshare did not start its init; see {self.workdir / 'log' / 'init.log'}")
            time.sleep(0.02)
        self.init_pid = int(text.split()[0])
        self.mount_namespace = os.readlink(f"/proc/{self.init_pid}/ns/mnt")
        self.netns = NetworkNamespace(f"/proc/{self.init_pid}/ns/net")

    def enter(self, pid_namespace: bool = False) -> list[str]:
        """The nsenter prefix that runs a command inside the node (mount + network, and PID if asked)."""
        return ["nsenter", f"--target={self.init_pid}", "--mount", "--net", *(["--pid"] if pid_namespace else []), "--"]

    def run(self, *argv: str, timeout: float = 120) -> str:
        """Run a short command inside the node; returns stdout, raises with its output on failure."""
        result = subprocess.run([*self.enter(), *argv], capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} (in the node) exited {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    def _make_network(self) -> None:
        self.run("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/run")
        for key, value in KUBELET_SYSCTLS.items():
            if Path(f"/proc/sys/{key}").read_text().strip() == value:
                continue
            shown = self.workdir / "sysctl" / key.replace("/", ".")
            shown.write_text(value + "\n")
            self.run("mount", "--bind", str(shown), f"/proc/sys/{key}")
        gateway = ipaddress.ip_interface(f"{NODE_IP}/{ipaddress.ip_network(POD_CIDR).prefixlen}")
        self.run("ip", "link", "set", "lo", "up")
        self.run("ip", "link", "add", BRIDGE, "type", "bridge")
        self.run("ip", "addr", "add", str(gateway), "dev", BRIDGE)
        self.run("ip", "link", "set", BRIDGE, "up")
        # The node itself reaches ClusterIPs (kube-proxy DNATs locally sent packets in OUTPUT).
        self.run("ip", "route", "add", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_IP)

    def _make_cgroups(self) -> None:
        """`<own memory cgroup>/dbp-node-<init pid>-<its start time>` in every v1 hierarchy (cpuset: with
        cpus and mems). Those of nodes whose init is gone (a killed run) are removed first."""
        own = next(
            line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.split(":", 2)[1] == "memory"
        )
        parent = own.rstrip("/")
        self.cgroup = f"{parent}/{_node_cgroup_name(self.init_pid)}"
        names = {old.name for h in _hierarchies(unified=True) for old in (h / parent.lstrip("/")).glob("dbp-node-*")}
        for name in names:
            pid = name.removeprefix("dbp-node-").split("-")[0]
            if not pid.isdigit() or _node_cgroup_name(int(pid)) != name:
                _remove_cgroup(f"{parent}/{name}", wait=5)
        for hierarchy in _hierarchies():
            path = hierarchy / self.cgroup.lstrip("/")
            path.mkdir(parents=True, exist_ok=True)
            if hierarchy.name == "cpuset":
                node = hierarchy
                for part in self.cgroup.strip("/").split("/"):
                    node = node / part
                    for knob in ("cpuset.cpus", "cpuset.mems"):
                        if not (node / knob).read_text().strip():
                            (node / knob).write_text((hierarchy / knob).read_text())

    def _kill_cgroup_processes(self) -> None:
        if not self.cgroup:
            return
        for _ in range(20):
            pids = [
                int(pid)
                for procs in (Path("/sys/fs/cgroup/pids") / self.cgroup.lstrip("/")).rglob("cgroup.procs")
                for pid in procs.read_text().split()
            ]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.25)

    def _remove_cgroups(self) -> None:
        if self.cgroup:
            _remove_cgroup(self.cgroup, wait=15)
            self.cgroup = ""

    # -- processes -----------------------------------------------------------------------------

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start a node component inside the namespaces; output to log/<name>.log."""
        proc = spawn([*self.enter(pid_namespace=True), *argv], self.workdir / "log" / f"{name}.log")
        self._procs[name] = proc
        return proc

    def _wait_inside(self, host: str, port: int, timeout: float, name: str) -> None:
        assert self.netns is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self._procs.get(name) or (self._etcd if name == "etcd" else self._apiserver)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.log(name)}")
            try:
                self.netns.connect(host, port, timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{name} did not listen on {host}:{port} within {timeout:.0f}s; see {self.log(name)}")

    def log(self, name: str) -> Path:
        """A component's log file (etcd, kube-apiserver, kubelet, containerd, coredns, ...)."""
        return self.workdir / "log" / f"{name}.log"

    def _start_containerd(self, timeout: float) -> None:
        (self.workdir / "cni" / "10-dbp.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "dbp",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "dataDir": str(self.workdir / "cni-ipam"),
                                "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                            },
                        }
                    ],
                }
            )
        )
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        pause = build_image(pause=True)  # the pod sandbox: catatonit (the upstream pause image is unreachable)
        (self.workdir / "containerd.toml").write_text(f"""version = 2
root = "{self.workdir / "containerd"}"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "/run/containerd/containerd.sock"
[{cri}]
  sandbox_image = "{pause.tag}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [{cri}.cni]
    bin_dir = "{CNI_DIR}"
    conf_dir = "{self.workdir / "cni"}"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
""")
        self._start("containerd", ["containerd", "--config", str(self.workdir / "containerd.toml")])
        deadline = time.monotonic() + timeout
        while subprocess.run([*self.enter(), "ctr", "version"], capture_output=True).returncode != 0:
            if self._procs["containerd"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start; see {self.log('containerd')}")
            time.sleep(0.2)
        self.load_image(pause)

    def load_image(self, image: Image) -> None:
        """Import an image tarball into containerd's k8s.io namespace (pods with IfNotPresent use it)."""
        self.run("ctr", "--namespace", "k8s.io", "images", "import", str(image.tarball), timeout=600)

    def tag_image(self, image: Image, tag: str) -> Image:
        """Another name for an imported image (a rollout to a new tag of the same content)."""
        self.run("ctr", "--namespace", "k8s.io", "images", "tag", "--force", image.tag, tag)
        return Image(tag, image.tarball)

    # -- control plane -------------------------------------------------------------------------

    def _start_etcd(self, timeout: float) -> None:
        self.etcd_url = "http://127.0.0.1:2379"
        self._etcd = spawn(
            [
                *self.enter(pid_namespace=True),
                *etcd_command(self.bin_dir, self.workdir / "etcd", self.etcd_url, "http://127.0.0.1:2380"),
            ],
            self.log("etcd"),
        )
        self._wait_inside("127.0.0.1", 2379, timeout, "etcd")

    def _start_apiserver(self, timeout: float) -> None:
        pki = self.workdir / "pki"
        self.ca = CertificateAuthority(pki, "kube")
        serving = self.ca.issue_server(
            "apiserver",
            (
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
            ),
            ("127.0.0.1", NODE_IP, KUBERNETES_SERVICE_IP),
        )
        sa_key, sa_pub = make_rsa_keypair(pki, "service-account")
        kubelet_client = self.ca.issue_client(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
        )
        self._apiserver = spawn(
            [
                *self.enter(pid_namespace=True),
                *apiserver_command(
                    self.bin_dir,
                    etcd_url=self.etcd_url,
                    bind_address="0.0.0.0",  # noqa: S104 - all interfaces of the node's own network namespace
                    advertise_address=NODE_IP,
                    port=APISERVER_PORT,
                    serving=serving,
                    client_ca=self.ca.ca_file,
                    service_account_keys=(sa_pub, sa_key),
                    service_cidr=SERVICE_CIDR,
                    cert_dir=pki,
                    authorization_mode="Node,RBAC",
                ),
                "--enable-admission-plugins",
                "NodeRestriction",
                "--kubelet-client-certificate",
                str(kubelet_client.cert_file),
                "--kubelet-client-key",
                str(kubelet_client.key_file),
                "--kubelet-preferred-address-types",
                "InternalIP",
                *self.extra_args,
            ],
            self.log("kube-apiserver"),
        )
        self._sa_key = sa_key
        self._wait_inside("127.0.0.1", APISERVER_PORT, timeout, "kube-apiserver")
        self.port = self.forward("127.0.0.1", APISERVER_PORT)  # self.url: the relay on host loopback
        self._wait_ready(timeout, self.log("kube-apiserver"))

    def apiserver_log(self) -> Path:
        return self.log("kube-apiserver")

    def _inside_kubeconfig(self, name: str, cert: CertFiles) -> Path:
        """A kubeconfig for a component inside the node (the apiserver at 127.0.0.1:6443 there)."""
        assert self.ca is not None
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "node",
                            "cluster": {
                                "server": f"https://127.0.0.1:{APISERVER_PORT}",
                                "certificate-authority": str(self.ca.ca_file),
                            },
                        }
                    ],
                    "users": [
                        {
                            "name": name,
                            "user": {"client-certificate": str(cert.cert_file), "client-key": str(cert.key_file)},
                        }
                    ],
                    "contexts": [{"name": "node", "context": {"cluster": "node", "user": name}}],
                    "current-context": "node",
                }
            )
        )
        path.chmod(0o600)
        return path

    def _start_control_loop(self, name: str, cert: CertFiles, *flags: str) -> None:
        """kube-controller-manager or kube-scheduler: its own kubeconfig for every API call, no leader
        election (one node), its endpoints on loopback inside the node."""
        kubeconfig = str(self._inside_kubeconfig(name, cert))
        self._start(
            name,
            [
                str(self.node_bin / name),
                "--kubeconfig",
                kubeconfig,
                "--authentication-kubeconfig",
                kubeconfig,
                "--authorization-kubeconfig",
                kubeconfig,
                *flags,
                "--leader-elect=false",
                "--bind-address",
                "127.0.0.1",
                "--v",
                "1",
            ],
        )

    def _start_node_components(self) -> None:
        assert self.ca is not None
        ca = str(self.ca.ca_file)
        self._start_control_loop(
            "kube-controller-manager",
            self.ca.issue_client("kcm", "system:kube-controller-manager"),
            "--root-ca-file",
            ca,
            "--service-account-private-key-file",
            str(self._sa_key),
            "--use-service-account-credentials",  # no CSR signer: the kubelet serves with a self-signed certificate
        )
        self._start_control_loop("kube-scheduler", self.ca.issue_client("scheduler", "system:kube-scheduler"))
        proxy = self._inside_kubeconfig("kube-proxy", self.ca.issue_client("proxy", "system:kube-proxy"))
        proxy_config = self.workdir / "kube-proxy.yaml"
        proxy_config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(proxy)},
                    "mode": "iptables",
                    "clusterCIDR": POD_CIDR,
                    "hostnameOverride": NODE_NAME,
                    "bindAddress": "127.0.0.1",
                    "metricsBindAddress": "127.0.0.1:10249",
                    "healthzBindAddress": "127.0.0.1:10256",
                    "conntrack": {"maxPerCore": 0, "min": 0},
                }
            )
        )
        self._start("kube-proxy", [str(self.node_bin / "kube-proxy"), "--config", str(proxy_config), "--v", "1"])
        kubelet = self._inside_kubeconfig(
            "kubelet", self.ca.issue_client("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",))
        )
        kubelet_config = self.workdir / "kubelet.yaml"
        kubelet_config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    "authentication": {
                        "anonymous": {"enabled": False},
                        "webhook": {"enabled": True},
                        "x509": {"clientCAFile": ca},
                    },
                    "authorization": {"mode": "Webhook"},
                    "cgroupDriver": "cgroupfs",
                    "cgroupRoot": self.cgroup,
                    "failCgroupV1": False,
                    "failSwapOn": False,
                    "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
                    "podLogsDir": str(self.workdir / "pod-logs"),
                    "oomScoreAdj": 0,
                    "readOnlyPort": 0,
                    "resolvConf": "/etc/resolv.conf",
                    "clusterDNS": [DNS_SERVICE_IP],
                    "clusterDomain": CLUSTER_DOMAIN,
                    # Mounted Secrets and ConfigMaps are refreshed on the pod's periodic sync (default 1m).
                    "syncFrequency": "10s",
                    "imageGCHighThresholdPercent": 100,
                    "imageGCLowThresholdPercent": 99,
                    "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
                }
            )
        )
        self._start(
            "kubelet",
            [
                str(self.node_bin / "kubelet"),
                "--config",
                str(kubelet_config),
                "--kubeconfig",
                str(kubelet),
                "--hostname-override",
                NODE_NAME,
                "--node-ip",
                NODE_IP,
                "--root-dir",
                str(self.workdir / "kubelet"),
                "--cert-dir",
                str(self.workdir / "kubelet-certs"),
                "--v",
                "1",
            ],
        )

    def _start_dns(self, timeout: float) -> None:
        """CoreDNS inside the node, on the node's address; the kube-dns Service (DNS_SERVICE_IP) routes to it."""
        assert self.ca is not None
        kubeconfig = self._inside_kubeconfig(
            "coredns", self.ca.issue_client("coredns", "system:coredns", ("system:masters",))
        )
        corefile = self.workdir / "Corefile"
        corefile.write_text(f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {NODE_IP}
    errors
    ready 127.0.0.1:{DNS_READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig} node
    }}
}}
""")
        self._start("coredns", [str(self.coredns_bin / "coredns"), "-conf", str(corefile)])
        self._wait_inside("127.0.0.1", DNS_READY_PORT, timeout, "coredns")
        self._service("kube-system", "kube-dns", DNS_SERVICE_IP, [("dns", "UDP", 53, 53), ("dns-tcp", "TCP", 53, 53)])

    def _wait_node_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "not registered"
        with self.admin_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            while time.monotonic() < deadline:
                for name in ("kubelet", "containerd", "kube-proxy"):
                    if self._procs[name].poll() is not None:
                        raise RuntimeError(f"{name} exited; see {self.log(name)}")
                try:
                    status = core.read_node(NODE_NAME).status
                    conditions = (status.conditions if status else None) or []
                    ready = next((c for c in conditions if c.type == "Ready"), None)
                    # The controller-manager makes each namespace's `default` ServiceAccount; pods need it.
                    if (
                        ready is not None
                        and ready.status == "True"
                        and _exists(core.read_namespaced_service_account, "default", "default")
                    ):
                        return
                    last = f"Ready={ready.status if ready else None} ({ready.message if ready else ''})"
                except ApiException as exc:
                    last = f"{exc.status}"
                time.sleep(0.5)
        raise TimeoutError(f"node {NODE_NAME} not Ready within {timeout:.0f}s: {last}; see {self.log('kubelet')}")

    # -- reaching the node ---------------------------------------------------------------------

    def forward(self, host: str, port: int) -> int:
        """A port on host loopback that leads to host:port inside the node (a pod, a ClusterIP); one
        relay per target, kept until `close()`."""
        assert self.netns is not None
        if (host, port) not in self._forwards:
            relay = forward_in(self.netns, host, port)
            self._relays.append(relay)
            self._forwards[(host, port)] = relay.port
        return self._forwards[(host, port)]

    def expose_service(self, namespace: str, name: str, port: int, local_port: int) -> ExposedService:
        """Offer the server on host 127.0.0.1:local_port to pods as the Service `name` (port `port`):
        a relay listens on the node's address, and a selector-less Service with an EndpointSlice
        points at it, so pods resolve `<name>.<namespace>.svc` through cluster DNS as on a real cluster."""
        assert self.netns is not None
        relay = forward_out(self.netns, NODE_IP, local_port)
        self._relays.append(relay)
        self.ensure_namespace(namespace)
        cluster_ip = self._service(namespace, name, None, [("tcp", "TCP", port, relay.port)])
        return ExposedService(namespace, name, port, cluster_ip, relay)

    def _service(
        self, namespace: str, name: str, cluster_ip: str | None, ports: list[tuple[str, str, int, int]]
    ) -> str:
        """A selector-less Service and its EndpointSlice to NODE_IP; returns the ClusterIP.
        `ports`: (name, protocol, service port, port on NODE_IP)."""
        service: Any = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": [{"name": n, "protocol": p, "port": sp, "targetPort": tp} for n, p, sp, tp in ports]},
        }
        if cluster_ip is not None:
            service["spec"]["clusterIP"] = cluster_ip
        endpoints: Any = {
            "metadata": {
                "name": f"{name}-harness",
                "namespace": namespace,
                "labels": {"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": MANAGED_BY},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
            "ports": [{"name": n, "protocol": p, "port": tp} for n, p, _, tp in ports],
        }
        with self.admin_client() as api:
            created = kubernetes.client.CoreV1Api(api).create_namespaced_service(namespace, service)
            kubernetes.client.DiscoveryV1Api(api).create_namespaced_endpoint_slice(namespace, endpoints)
        return str(created.spec.cluster_ip if created.spec else "")

    def kubectl(self, *args: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl (the pinned one) as admin, from the host through the apiserver relay."""
        kubeconfig = self.workdir / "admin.kubeconfig"
        if not kubeconfig.exists():
            self.write_kubeconfig(kubeconfig)
        return subprocess.run(
            [str(self.node_bin / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=stdin,
        )

    def container_pids(self, container_id: str) -> list[int]:
        """Host PIDs of a container's processes (`containerd://<id>` from a pod's status), by its cgroup."""
        cid = container_id.split("://", 1)[-1]
        root = Path("/sys/fs/cgroup/pids") / self.cgroup.lstrip("/")
        return [int(pid) for procs in root.rglob(f"{cid}/cgroup.procs") for pid in procs.read_text().split()]

    def processes_inside(self) -> list[int]:
        """Host PIDs of every process in the node's mount namespace (none after `close()`)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "ns" / "mnt") == self.mount_namespace:
                        found.append(int(entry.name))
        return found


def _exists(read: Callable[..., object], *args: str) -> bool:
    try:
        read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _hierarchies(unified: bool = False) -> list[Path]:
    """The cgroup v1 hierarchies (and, if asked, the hybrid layout's v2 mount)."""
    return [
        p
        for p in sorted(Path("/sys/fs/cgroup").iterdir())
        if p.is_dir() and (unified or p.name != "unified") and (p / "cgroup.procs").exists()
    ]


def _remove_cgroup(relative: str, wait: float) -> None:
    """Remove a cgroup tree from every hierarchy (runc also makes the containers' in the v2 mount),
    retrying for up to `wait` seconds while processes killed a moment ago are still being released."""
    deadline = time.monotonic() + wait
    for hierarchy in _hierarchies(unified=True):
        path = hierarchy / relative.lstrip("/")
        while path.exists() and not _rmdir_tree(path) and time.monotonic() < deadline:
            time.sleep(0.2)


def _node_cgroup_name(init_pid: int) -> str:
    """`dbp-node-<pid>-<start time>`: a PID alone could be a new process' by the time a stale one is found.
    A zombie counts as gone (a killed node's init may wait a moment to be reaped)."""
    try:
        fields = Path(f"/proc/{init_pid}/stat").read_text().rsplit(")", 1)[1].split()
        started = fields[19] if fields[0] != "Z" else "gone"
    except (OSError, IndexError):
        started = "gone"
    return f"dbp-node-{init_pid}-{started}"


def _rmdir_tree(path: Path) -> bool:
    """Remove an empty cgroup tree (leaves first); False while a cgroup still has processes."""
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir()
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
