"""The consumer API (Falcon): authentication, quotas, database lifecycle and credentials.

Reads the shared informer caches; never imports `reconciler`.
"""
