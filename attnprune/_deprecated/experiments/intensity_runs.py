"""Moved to ``attnprune.research.experiments.intensity_runs``."""
from attnprune._deprecated import alias

alias("attnprune.experiments.intensity_runs", "attnprune.research.experiments.intensity_runs", run_as_main=__name__ == "__main__")
