"""The consumer agent at 1,000 claims: what it costs the provider at rest, and what it costs itself.

    python -m bench.agent [--claims 1000] [--poll-interval 30] [--steady-seconds 180]

The provider as in production (a real apiserver, PostgreSQL 18, `dbprovider manager` as its own process)
and a consumer cluster of its own (a second real apiserver) where `dbprovider agent` runs as a process.
`--claims` DatabaseClaims are created at once; once every one is Ready with its Secret, the provider's
request counter (dbprovider_api_requests_total) is read before and after `--steady-seconds` of rest.
Target: at rest at most one request per poll from the agent, whatever the number of claims (<= 2 per
minute with the default 30 s poll); the agent's RSS and CPU (ramp and rest) are reported, and the claim
status writes at rest (the agent's dbprovider_agent_claim_status_writes_total), which should be none.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import (
    ManagerProcess,
    ResultsFiles,
    Stack,
    Target,
    bench_parser,
    log,
    machine_line,
    report_targets,
    table,
    wait_for,
)
from domain.agent_config import load_agent_config
from domain.resources import CLAIMS, CONSUMERS, SHARDS
from harness import KubeControlPlane
from harness.process import free_port
from informers import Rest
from infra.render import render_agent_manifests

REPO = Path(__file__).resolve().parents[1]
AGENT_NAMESPACE = "dbprovider-agent"
CLAIM_NAMESPACE = "bench"


def provider_requests(manager: ManagerProcess) -> float:
    """Every API request the provider answered so far (the agent is its only client)."""
    total = 0.0
    for line in manager.metrics().splitlines():
        if line.startswith("dbprovider_api_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def agent_status_writes(metrics_url: str) -> float:
    """The claim status writes the agent made so far (its own counter)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith("dbprovider_agent_claim_status_writes_total "):
            return float(line.rsplit(" ", 1)[1])
    raise RuntimeError("the agent's metrics have no dbprovider_agent_claim_status_writes_total")


def ready_claims(rest: Rest) -> int:
    items = rest.list(CLAIMS, CLAIM_NAMESPACE)["items"]
    return sum(
        1
        for claim in items
        if any(
            c["type"] == "Ready" and c["status"] == "True" for c in (claim.get("status") or {}).get("conditions", [])
        )
    )


def apply(rest: Rest, objects: list[dict[str, Any]]) -> None:
    from dbprovider.kubeapply import Applier

    applier = Applier(rest)
    for obj in objects:
        for _ in range(30):  # a CRD's kind is served a moment after its creation
            try:
                applier.apply(obj)
                break
            except LookupError:
                time.sleep(0.5)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--poll-interval", type=float, default=30.0)
    parser.add_argument("--steady-seconds", type=float, default=180.0)
    args = parser.parse_args()
    import psutil

    # One connection per database and room on the one PostgreSQL server for all of them (placement
    # counts the connection budget: max_connections less the reserve).
    stack = Stack(
        "agent",
        config={"sizeClasses": {"small": {"connectionLimit": 1}}},
        postgres_settings={"max_connections": str(args.claims + 200)},
    )
    consumer: KubeControlPlane | None = None
    manager: ManagerProcess | None = None
    agent: subprocess.Popen[bytes] | None = None
    try:
        dev = stack.start_dev()
        admin = stack.admin_rest()
        room = {"spec": {"maxDatabases": args.claims + 10}}  # the quota and the shard take every claim
        admin.patch(CONSUMERS, dev.consumer, room)
        admin.patch(SHARDS, dev.shard, room)
        manager = ManagerProcess(stack)
        manager.wait_leading(admin)
        log("starting the consumer cluster's apiserver")
        consumer = KubeControlPlane().start()
        consumer.ensure_namespace(AGENT_NAMESPACE)
        consumer.ensure_namespace(CLAIM_NAMESPACE)
        consumer_rest = Rest(consumer.admin_client())
        provider_url = f"https://127.0.0.1:{manager.api_port}"
        values = {"providerUrl": provider_url, "tokenSecret": "dbprovider-token", "namespace": AGENT_NAMESPACE}
        apply(consumer_rest, render_agent_manifests(load_agent_config(values)))
        token_file = stack.state_dir / "token"
        token_file.write_text(dev.token)
        kubeconfig = consumer.write_kubeconfig(
            stack.state_dir / "agent.kubeconfig",
            token=consumer.service_account_token(AGENT_NAMESPACE, "dbprovider-agent", seconds=24 * 3600),
        )
        metrics_port = free_port()
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        argv = [
            sys.executable,
            "-m",
            "dbprovider.cli",
            "agent",
            *("--provider-url", provider_url, "--token-file", str(token_file), "--ca-file", str(dev.ca_file)),
            *("--kubeconfig", str(kubeconfig), "--namespace", AGENT_NAMESPACE),
            *("--poll-interval", str(args.poll_interval)),
            *("--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1"),
        ]
        with open(stack.state_dir / "agent.log", "wb") as out:
            agent = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ})
        agent_proc = psutil.Process(agent.pid)

        log(f"creating {args.claims} claims")
        started = time.monotonic()
        body = {"apiVersion": CLAIMS.api_version, "kind": "DatabaseClaim", "spec": {"sizeClass": "small"}}
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda n: consumer_rest.create(
                        CLAIMS, {**body, "metadata": {"name": f"c{n:05d}", "namespace": CLAIM_NAMESPACE}}
                    ),
                    range(args.claims),
                )
            )
        wait_for(lambda: ready_claims(consumer_rest) >= args.claims, 3600, "every claim Ready", interval=5)
        ramp_seconds = time.monotonic() - started
        ramp_cpu = sum(agent_proc.cpu_times()[:2])
        ramp_requests = provider_requests(manager)
        log(f"all {args.claims} claims Ready in {ramp_seconds:.0f} s; resting {args.steady_seconds:.0f} s")
        time.sleep(args.poll_interval)  # the passes that follow the last writes
        before, cpu_before, rest_started = provider_requests(manager), sum(agent_proc.cpu_times()[:2]), time.monotonic()
        writes_before = agent_status_writes(metrics_url)
        time.sleep(args.steady_seconds)
        rest_seconds = time.monotonic() - rest_started
        at_rest = provider_requests(manager) - before
        status_writes = agent_status_writes(metrics_url) - writes_before
        rest_cpu = sum(agent_proc.cpu_times()[:2]) - cpu_before
        per_minute = at_rest / (rest_seconds / 60)
        rss = agent_proc.memory_info().rss / 2**20
        table(
            f"dbprovider agent, {args.claims} claims, poll {args.poll_interval:.0f} s ({machine_line()})",
            [
                ("claims Ready after", f"{ramp_seconds:.0f} s"),
                ("provider requests until then", f"{ramp_requests:.0f}"),
                ("agent CPU until then", f"{ramp_cpu:.1f} s"),
                ("provider requests at rest", f"{at_rest:.0f} in {rest_seconds:.0f} s ({per_minute:.2f}/min)"),
                ("agent CPU at rest", f"{100 * rest_cpu / rest_seconds:.2f} % of a core"),
                ("agent RSS", f"{rss:.0f} MiB"),
                ("claim status writes at rest", f"{status_writes:.0f} in {rest_seconds:.0f} s"),
            ],
        )
        allowed = 60 / args.poll_interval  # one request per poll
        figure = (
            f"agent requests at rest {per_minute:.2f}/min ({at_rest:.0f} conditional lists in {rest_seconds:.0f} s); "
            f"agent RSS {rss:.0f} MiB, {100 * rest_cpu / rest_seconds:.2f}% of a core at rest"
        )
        target = Target(
            figure,
            f"<= {allowed:g}/min (one per poll)",
            per_minute <= allowed,
            key="requests-at-rest",
            what=f"the agent's requests to the provider at rest, {args.claims} claims Ready",
            value=per_minute,
            unit="/min",
        )
        report_targets([target], ResultsFiles.of("bench.agent", args))
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(30)
        if consumer is not None:
            consumer.close()
        stack.close(manager)


if __name__ == "__main__":
    main()
