"""Moved to ``attnprune.runs.distributed``."""
from attnprune._deprecated import alias

alias("attnprune.distributed", "attnprune.runs.distributed", run_as_main=__name__ == "__main__")
