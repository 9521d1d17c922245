"""The telephone-chain benchmark of TeamTR against naive, joint and HAPPO (``orchestra bench teamtr``).

* :mod:`~orchestra.teamtr.bench.config` — :class:`BenchConfig`, composed with the ``TeamTRConfig`` of every run;
* :mod:`~orchestra.teamtr.bench.run` — the runs, ``runs.csv`` and resume (:func:`run_bench`);
* :mod:`~orchestra.teamtr.bench.analysis` — pure functions from the rows to the tables and the acceptance checks;
* :mod:`~orchestra.teamtr.bench.report` — ``summary.md`` and the plots.
"""
