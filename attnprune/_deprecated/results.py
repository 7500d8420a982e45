"""Moved to ``attnprune.runs.results``."""
from attnprune._deprecated import alias

alias("attnprune.results", "attnprune.runs.results", run_as_main=__name__ == "__main__")
