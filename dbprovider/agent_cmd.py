"""`dbprovider agent`: the consumer agent until SIGTERM (agent.runner does the work)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from agent.metrics import AgentEndpoint, AgentMetrics
from agent.provider import Provider
from agent.runner import Agent, AgentOptions
from dbprovider.manager import kube_client, wait_for_stop
from informers import Rest

log = logging.getLogger(__name__)


def run_agent(args: argparse.Namespace) -> int:
    if not args.provider_url or not args.provider_url.startswith("https://"):
        print("dbprovider agent: --provider-url (or $DBPROVIDER_API_URL) must be an https:// URL", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    options = AgentOptions(
        namespace=args.namespace,
        lease_name=args.lease_name,
        watch_namespace=args.watch_namespace,
        poll_interval=args.poll_interval,
        retry_interval=min(5.0, args.poll_interval),
        max_backoff=args.max_backoff,
        leader_election=not args.no_leader_election,
    )
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    rest = Rest(kube_client(args.kubeconfig, identity="agent"))
    metrics = AgentMetrics()
    provider = Provider(args.provider_url, args.token_file, args.ca_file, on_answer=metrics.observe_request)
    agent = Agent(rest, provider, options, metrics)
    endpoint = AgentEndpoint(args.metrics_port, metrics.registry, agent.alive, agent.ready, args.metrics_host).start()
    agent.start()
    log.info("agent started (provider %s, metrics and probes on port %d)", args.provider_url, endpoint.port)
    try:
        wait_for_stop(stop)
    finally:
        endpoint.stop()
        agent.stop()
    return 0
