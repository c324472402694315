"""The admin CLI: ``postbox jobs|dlq|queues|workers``, talking to PostgreSQL and Redis directly."""
