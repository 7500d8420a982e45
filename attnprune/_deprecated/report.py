"""Moved to ``attnprune.runs.report``."""
from attnprune._deprecated import alias

alias("attnprune.report", "attnprune.runs.report", run_as_main=__name__ == "__main__")
