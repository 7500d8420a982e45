"""Moved to ``attnprune.research.experiments``."""
from attnprune._deprecated import forward

__getattr__ = forward(__name__, "attnprune.research.experiments")
