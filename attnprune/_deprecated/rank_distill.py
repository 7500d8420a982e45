"""Moved to ``attnprune.train.rank_distill``."""
from attnprune._deprecated import alias

alias("attnprune.rank_distill", "attnprune.train.rank_distill", run_as_main=__name__ == "__main__")
