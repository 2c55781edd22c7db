"""The consumer agent (`dbprovider agent`): DatabaseClaims in a consumer cluster, kept by the provider's API.

It runs in the consumer cluster with the consumer's bearer token. Of ours it imports `domain` and
`informers` only, never `api` or `reconciler` (import-linter checks it): it talks to the provider
over its public API, as any consumer does.
"""
