"""Moved to ``attnprune.research.experiments.attention_parity``."""
from attnprune._deprecated import alias

alias("attnprune.experiments.attention_parity", "attnprune.research.experiments.attention_parity", run_as_main=__name__ == "__main__")
