"""The Shard controller and what it shares with the Database workers: admin sessions, link facts, budgets,
suspected shards."""
