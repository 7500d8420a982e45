"""Moved to ``attnprune.deploy.integrations``."""
from attnprune._deprecated import alias

alias("attnprune.integrations", "attnprune.deploy.integrations", run_as_main=__name__ == "__main__")
