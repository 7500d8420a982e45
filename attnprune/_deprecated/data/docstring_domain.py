"""Moved to ``attnprune.research.data.docstring_domain``."""
from attnprune._deprecated import alias

alias("attnprune.data.docstring_domain", "attnprune.research.data.docstring_domain", run_as_main=__name__ == "__main__")
