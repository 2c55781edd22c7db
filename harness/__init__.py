"""Real components on loopback for tests and `dbprovider dev`: kube-apiserver + etcd and PostgreSQL.

Nothing here is a fake: the harness starts the real binaries on free ports, as a throwaway
environment that is torn down (processes and files) when it is closed.
"""

from harness.kube import KubeControlPlane, MissingBinaryError
from harness.postgres import POSTGRES_FLAVORS, PostgresServer

__all__ = ["KubeControlPlane", "MissingBinaryError", "POSTGRES_FLAVORS", "PostgresServer"]
