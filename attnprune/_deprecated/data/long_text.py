"""Moved to ``attnprune.research.data.long_text``."""
from attnprune._deprecated import alias

alias("attnprune.data.long_text", "attnprune.research.data.long_text", run_as_main=__name__ == "__main__")
