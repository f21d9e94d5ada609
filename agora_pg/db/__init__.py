"""Everything that touches PostgreSQL: table metadata, SQL, the Store, the embedded server."""
