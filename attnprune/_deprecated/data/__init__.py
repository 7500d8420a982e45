"""Moved to ``attnprune.research.data``."""
from attnprune._deprecated import forward

__getattr__ = forward(__name__, "attnprune.research.data")
