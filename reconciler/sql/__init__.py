"""The SQL the Shard and Database controllers run on a shard: plain functions, no controller logic.

`session`: admin endpoint, sessions and the per-operation bound; `errors`: sanitized failures;
`provisioner`: the admin role's fitness and the SQL dialect; `tenant`: one tenant's role and
database. Never imports the controllers.
"""
