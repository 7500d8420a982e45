"""The research layer: the papers' tracks and experiments (finetune, lm, pareto, synthetic,
experiments/, data/, analysis and figures). Free to import everything below it; nothing in the
library, the training or the run layer imports it (``tests/test_architecture.py``)."""
