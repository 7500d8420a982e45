"""Moved to ``attnprune.research.synthetic.train``."""
from attnprune._deprecated import alias

alias("attnprune.synthetic.train", "attnprune.research.synthetic.train", run_as_main=__name__ == "__main__")
