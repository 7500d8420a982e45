"""Moved to ``attnprune.methods.registry``."""
from attnprune._deprecated import alias

alias("attnprune.registry", "attnprune.methods.registry", run_as_main=__name__ == "__main__")
