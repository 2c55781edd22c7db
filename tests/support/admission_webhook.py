"""A real validating admission webhook on loopback, called by the real kube-apiserver, that refuses the
creates of chosen Databases: at once, or after holding each request until the test says so.

It makes "the apiserver refused the create" and "the replica died while its create was in flight"
happen exactly when a test wants them, without touching the product:

    with RefusingWebhook(kube, tmp_path, namespace, external_id="doomed", hold=True) as webhook:
        ... PUT /v1/databases/doomed on a replica (in a thread) ...
        webhook.wait_received()          # the create reached the apiserver and waits here
        replica.stop(signal.SIGKILL)
        webhook.release()                # now the apiserver refuses it

Only creates of Databases labelled `db.bnerd.com/external-id=<external_id>` in `namespace` reach it.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from domain.constants import API_VERSION, GROUP, LABEL_EXTERNAL_ID, PLURAL_DATABASES
from harness import KubeControlPlane
from harness.certs import CertificateAuthority
from informers import Resource, Rest
from tests.support.common import unique, wait_for


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the apiserver drops a held call when its client (a killed replica) goes away


WEBHOOKS = Resource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
HOLD_LIMIT = 25.0  # below the webhook's timeoutSeconds (30): a held request is refused before the apiserver gives up


class RefusingWebhook:
    def __init__(self, kube: KubeControlPlane, workdir: Path, namespace: str, external_id: str, *, hold: bool) -> None:
        self.kube = kube
        self.namespace = namespace
        self.external_id = external_id
        self.hold = hold
        self.name = unique("dbprovider-test-refuse")
        self.received: list[dict[str, Any]] = []  # the Database objects of the creates that arrived (not dry runs)
        self._arrived = threading.Event()
        self._released = threading.Event()
        authority = CertificateAuthority(workdir / self.name, self.name)
        cert = authority.issue_server("webhook", ("localhost",), ("127.0.0.1",))
        self._ca_pem = authority.ca_file.read_bytes()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert.cert_file, cert.key_file)
        self.server = _QuietServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RefusingWebhook:
        self._thread.start()
        self._client = self.kube.admin_client()
        self.rest = Rest(self._client)
        self.rest.create(WEBHOOKS, self._configuration())
        self._wait_active()
        return self

    def __exit__(self, *exc: object) -> None:
        self._released.set()
        try:
            self.rest.delete(WEBHOOKS, self.name)
        finally:
            self._client.close()
            self.server.shutdown()
            self.server.server_close()

    def wait_received(self, timeout: float = 30) -> dict[str, Any]:
        wait_for(self._arrived.is_set, timeout, f"a create of {self.external_id} at the webhook")
        return self.received[-1]

    def release(self) -> None:
        self._released.set()

    # -- internals -------------------------------------------------------------------------------

    def _configuration(self) -> dict[str, Any]:
        port = self.server.server_address[1]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                {
                    "name": "refuse.test.dbprovider.example.com",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/validate",
                        "caBundle": base64.b64encode(self._ca_pem).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [GROUP],
                            "apiVersions": ["*"],
                            "resources": [PLURAL_DATABASES],
                        }
                    ],
                    "objectSelector": {"matchLabels": {LABEL_EXTERNAL_ID: self.external_id}},
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 30,
                }
            ],
        }

    def _wait_active(self) -> None:
        """The apiserver loads webhook configurations asynchronously: probe with dry-run creates."""
        probe = {
            "apiVersion": API_VERSION,
            "kind": "Database",
            "metadata": {
                "name": unique("probe"),
                "namespace": self.namespace,
                "labels": {LABEL_EXTERNAL_ID: self.external_id},
            },
            "spec": {"consumer": "probe", "externalId": self.external_id},
        }
        path = f"/apis/{API_VERSION}/namespaces/{self.namespace}/{PLURAL_DATABASES}"

        def refused() -> bool:
            try:
                self.rest.request("POST", path, query=[("dryRun", "All")], body=probe)
            except Exception as exc:  # noqa: BLE001 - the refusal is the answer we wait for
                return "refused by the test webhook" in str(getattr(exc, "body", "") or "")
            return False

        wait_for(refused, 30, "the test webhook to be called")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's naming
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                if not request.get("dryRun"):
                    webhook.received.append(request.get("object") or {})
                    webhook._arrived.set()
                    if webhook.hold:
                        webhook._released.wait(HOLD_LIMIT)
                answer = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {
                        "uid": request["uid"],
                        "allowed": False,
                        "status": {"code": 403, "message": "refused by the test webhook"},
                    },
                }
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler
