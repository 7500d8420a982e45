"""Moved to ``attnprune.research.pareto``."""
from attnprune._deprecated import alias

alias("attnprune.pareto", "attnprune.research.pareto", run_as_main=__name__ == "__main__")
