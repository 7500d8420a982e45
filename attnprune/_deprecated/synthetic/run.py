"""Moved to ``attnprune.research.synthetic.run``."""
from attnprune._deprecated import alias

alias("attnprune.synthetic.run", "attnprune.research.synthetic.run", run_as_main=__name__ == "__main__")
