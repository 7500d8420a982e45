"""Moved to ``attnprune.research.lm_figures``."""
from attnprune._deprecated import alias

alias("attnprune.lm_figures", "attnprune.research.lm_figures", run_as_main=__name__ == "__main__")
