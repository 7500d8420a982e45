"""Moved to ``attnprune.research.lm``."""
from attnprune._deprecated import alias

alias("attnprune.lm", "attnprune.research.lm", run_as_main=__name__ == "__main__")
