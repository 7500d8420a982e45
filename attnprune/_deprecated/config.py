"""Moved to ``attnprune.runs.config``."""
from attnprune._deprecated import alias

alias("attnprune.config", "attnprune.runs.config", run_as_main=__name__ == "__main__")
