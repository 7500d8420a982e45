"""Moved to ``attnprune.train.baselines``."""
from attnprune._deprecated import alias

alias("attnprune.baselines", "attnprune.train.baselines", run_as_main=__name__ == "__main__")
