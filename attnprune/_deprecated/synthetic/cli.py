"""Moved to ``attnprune.research.synthetic.cli``."""
from attnprune._deprecated import alias

alias("attnprune.synthetic.cli", "attnprune.research.synthetic.cli", run_as_main=__name__ == "__main__")
