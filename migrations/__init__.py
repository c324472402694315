if __name__ != "postbox.migrations":  # this folder imported under its own name, not as the installed package
    raise ImportError("import postbox.migrations, not migrations: the folder is installed as postbox.migrations")
