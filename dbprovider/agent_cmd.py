"""`dbprovider agent`: the consumer agent until SIGTERM (agent.runner does the work)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

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
    agent = Agent(rest, Provider(args.provider_url, args.token_file, args.ca_file), options).start()
    log.info("agent started (provider %s)", args.provider_url)
    try:
        wait_for_stop(stop)
    finally:
        agent.stop()
    return 0
