"""Dialect-free queue operations, one module per feature: receive (and later send, delayed, outbox)."""
