"""Moved to ``attnprune.research.experiments.token_budget``."""
from attnprune._deprecated import alias

alias("attnprune.experiments.token_budget", "attnprune.research.experiments.token_budget", run_as_main=__name__ == "__main__")
