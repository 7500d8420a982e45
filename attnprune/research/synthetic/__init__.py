"""The entropy-pruning paper's synthetic track, trained for real (``attnprune reproduce synthetic``).

    data.py     generator of §3.1 + preprocessing of §3.2 (random embeddings, IDF-like scaling)
    train.py    AdamW training loop with per-epoch validation (loss, accuracy, AUC)
    config.py   ``SyntheticConfig``, the methods, the ``--quick`` settings
    run.py      the experiment: methods × seeds, measurements, ablations, summary.json
    summary.py  means and intervals over seeds, paired comparisons, ablation cells, the table
    figures.py  the paper's figures, from the results folder
    cli.py      ``main(argv)`` of ``attnprune reproduce synthetic``

The model itself is :mod:`attnprune.research.synthetic.host`.
"""
