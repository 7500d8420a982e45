"""Moved to ``attnprune.deploy.sparse_ffn``."""
from attnprune._deprecated import alias

alias("attnprune.sparse_ffn", "attnprune.deploy.sparse_ffn", run_as_main=__name__ == "__main__")
