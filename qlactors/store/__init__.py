"""The durable store: one schema on SQLite and PostgreSQL and the repository that owns every state change."""
