"""The Shard and Database controllers and the SQL they run on the shards.

Never imports `api`.
"""
