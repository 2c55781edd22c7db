"""The consumer agent against a provider process and a consumer cluster of its own."""
