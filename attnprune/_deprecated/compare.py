"""Moved to ``attnprune.runs.compare``."""
from attnprune._deprecated import alias

alias("attnprune.compare", "attnprune.runs.compare", run_as_main=__name__ == "__main__")
