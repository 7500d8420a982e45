"""Moved to ``attnprune.research.synthetic.figures``."""
from attnprune._deprecated import alias

alias("attnprune.synthetic.figures", "attnprune.research.synthetic.figures", run_as_main=__name__ == "__main__")
