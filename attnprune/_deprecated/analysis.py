"""Moved to ``attnprune.research.analysis``."""
from attnprune._deprecated import alias

alias("attnprune.analysis", "attnprune.research.analysis", run_as_main=__name__ == "__main__")
