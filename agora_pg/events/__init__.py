"""Job and pipeline events across processes: read from the tables when PostgreSQL
notifies a change, replayed from the tables after a gap (``model`` is the pure part,
``stream`` the reader)."""
