"""Shard drains: a draining shard's databases moved off with DatabaseMove objects."""
