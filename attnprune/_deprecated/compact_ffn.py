"""Moved to ``attnprune.deploy.compact_ffn``."""
from attnprune._deprecated import alias

alias("attnprune.compact_ffn", "attnprune.deploy.compact_ffn", run_as_main=__name__ == "__main__")
