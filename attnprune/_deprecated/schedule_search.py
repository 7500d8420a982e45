"""Moved to ``attnprune.train.schedule_search``."""
from attnprune._deprecated import alias

alias("attnprune.schedule_search", "attnprune.train.schedule_search", run_as_main=__name__ == "__main__")
