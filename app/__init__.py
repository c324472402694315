"""postbox's application edge: the REST API, the admin CLI, the demo, benchmarks and the mail provider."""
