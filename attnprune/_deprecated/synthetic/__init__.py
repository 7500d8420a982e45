"""Moved to ``attnprune.research.synthetic``."""
from attnprune._deprecated import forward

__getattr__ = forward(__name__, "attnprune.research.synthetic")
