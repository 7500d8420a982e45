"""Moved to ``attnprune.research.synthetic.data``."""
from attnprune._deprecated import alias

alias("attnprune.synthetic.data", "attnprune.research.synthetic.data", run_as_main=__name__ == "__main__")
