"""Moved to ``attnprune.research.data.text``."""
from attnprune._deprecated import alias

alias("attnprune.data.text", "attnprune.research.data.text", run_as_main=__name__ == "__main__")
