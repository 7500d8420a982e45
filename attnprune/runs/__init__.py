"""The run layer: configs, results folders (atomic writes, resume), reports, paired
comparisons, statistics and multi-process runs. It imports the library and the training layer
below it, never the research layer above it."""
