"""The DatabaseMove controller: a Database moved to another shard online."""
