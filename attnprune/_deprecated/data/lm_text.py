"""Moved to ``attnprune.research.data.lm_text``."""
from attnprune._deprecated import alias

alias("attnprune.data.lm_text", "attnprune.research.data.lm_text", run_as_main=__name__ == "__main__")
