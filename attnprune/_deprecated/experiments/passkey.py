"""Moved to ``attnprune.research.experiments.passkey``."""
from attnprune._deprecated import alias

alias("attnprune.experiments.passkey", "attnprune.research.experiments.passkey", run_as_main=__name__ == "__main__")
