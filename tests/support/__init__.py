"""What the suites share: small helpers (common), the raw apiserver client (kubeapi), PostgreSQL
servers and superuser helpers (postgres), a test release of the provider with its fixtures
(install), the Shards and Databases a controller test creates (fleet), listed admin Secrets
(admin_secrets) and the controllers of one replica run in-process (in_process_manager).

A suite keeps in its own conftest only what is about that suite; suites never import from each other.
"""
