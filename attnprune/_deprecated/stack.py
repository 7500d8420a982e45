"""Moved to ``attnprune.hosts.stack``."""
from attnprune._deprecated import alias

alias("attnprune.stack", "attnprune.hosts.stack", run_as_main=__name__ == "__main__")
