"""postbox's application edge: the REST API, the admin CLI, the demo, benchmarks and the mail provider."""

if __name__ != "postbox.app":  # this folder imported under its own name, not as the installed package
    raise ImportError("import postbox.app, not app: the folder app/ is installed as postbox.app")
