"""The Shard, Database and Consumer controllers (a package each, wired by its setup.py; composed by setup.py)
and the SQL they run on the shards.

Never imports `api`.
"""
