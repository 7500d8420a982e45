"""Moved to ``attnprune.research.finetune``."""
from attnprune._deprecated import alias

alias("attnprune.finetune", "attnprune.research.finetune", run_as_main=__name__ == "__main__")
