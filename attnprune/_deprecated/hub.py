"""Moved to ``attnprune.deploy.hub``."""
from attnprune._deprecated import alias

alias("attnprune.hub", "attnprune.deploy.hub", run_as_main=__name__ == "__main__")
