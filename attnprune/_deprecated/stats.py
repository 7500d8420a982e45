"""Moved to ``attnprune.runs.stats``."""
from attnprune._deprecated import alias

alias("attnprune.stats", "attnprune.runs.stats", run_as_main=__name__ == "__main__")
