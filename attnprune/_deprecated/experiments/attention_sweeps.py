"""Moved to ``attnprune.research.experiments.attention_sweeps``."""
from attnprune._deprecated import alias

alias("attnprune.experiments.attention_sweeps", "attnprune.research.experiments.attention_sweeps", run_as_main=__name__ == "__main__")
