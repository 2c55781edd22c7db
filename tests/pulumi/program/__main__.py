"""Test-only entry point: infra/__main__.py (or the program DBPROVIDER_WRAPPED_PROGRAM names) unchanged, plus a
stack transform for an apiserver without nodes.

The harness runs kube-apiserver and etcd only: no kubelet starts a Pod and no kube-controller-manager
fills Endpoints or garbage-collects. Unchanged, `pulumi up` waits ten minutes for the Deployment and
Services to become ready and fails, and `pulumi destroy` hangs on Pulumi's default foreground deletion,
which waits for the garbage collector. So every Kubernetes object gets
`pulumi.com/deletionPropagationPolicy: background`, and Deployments and Services also get
`pulumi.com/skipAwait: "true"`. Nothing else changes; the suite ignores exactly these two annotations
when it compares the live objects with `dbprovider render`.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path
from typing import Any

import pulumi

import infra

# The project's program itself (the package is installed into the venv, editable from the checkout), or the
# program a test names in DBPROVIDER_WRAPPED_PROGRAM (the agent's, as docs/consumers.md shows it).
PROGRAM = Path(os.environ.get("DBPROVIDER_WRAPPED_PROGRAM") or Path(infra.__file__).resolve().parent / "__main__.py")
NODELESS_ANNOTATIONS = {"pulumi.com/deletionPropagationPolicy": "background"}
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}
AWAITED_TYPES = {"kubernetes:apps/v1:Deployment", "kubernetes:core/v1:Service"}


def _nodeless(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
    if not (args.custom and args.type_.startswith("kubernetes:") and "metadata" in args.props):
        return None
    props: dict[str, Any] = dict(args.props)
    metadata = dict(props["metadata"])
    annotations = dict(metadata.get("annotations") or {})
    annotations.update(NODELESS_ANNOTATIONS)
    if args.type_ in AWAITED_TYPES:
        annotations.update(SKIP_AWAIT)
    metadata["annotations"] = annotations
    props["metadata"] = metadata
    return pulumi.ResourceTransformResult(props=props, opts=args.opts)


pulumi.runtime.register_resource_transform(_nodeless)
runpy.run_path(str(PROGRAM), run_name="__main__")
