"""The telephone-chain experiment: TeamTR against naive, joint and HAPPO (``orchestra experiment chain``).

* :mod:`~orchestra.experiments.chain.config` — :class:`ChainExperimentConfig`, composed with the ``TeamTRConfig`` of
  every run;
* :mod:`~orchestra.experiments.chain.run` — the runs, ``runs.csv`` and resume (:func:`run_chain_experiment`);
* :mod:`~orchestra.experiments.chain.analysis` — pure functions from the rows to the tables and the acceptance checks;
* :mod:`~orchestra.experiments.chain.report` — ``summary.md`` and the plots.
"""
