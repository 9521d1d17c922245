"""The paired freshness experiment (issue 34 item 2; ``orchestra experiment freshness``): TeamTR's claim in its
purest form. From the team saved right after the upstream workers' updates, the last worker is updated once on the
STALE batch (sampled before those updates, as naive does) and once on a FRESH batch (sampled after, as TeamTR does),
with common random numbers and everything else equal; both arms are scored by the chain's exact team success J.

* :mod:`~orchestra.experiments.freshness.config` — :class:`FreshnessConfig` (chains, step sizes, pairs);
* :mod:`~orchestra.experiments.freshness.run` — one replicate pair (:func:`run_pair`), ``pairs.csv`` and resume;
* :mod:`~orchestra.experiments.freshness.analysis` — the per-cell paired statistics and the report.

The same experiment on the real-LLM team of ``orchestra experiment llm`` (``orchestra experiment freshness-llm``: the
solver upstream, the critic updated in the arms, each arm's team played greedily on held-out tasks):

* :mod:`~orchestra.experiments.freshness.llm_config` — :class:`LLMFreshnessConfig` (team, trainer, pairs, tasks);
* :mod:`~orchestra.experiments.freshness.llm_run` — one replicate pair, ``pairs.csv`` and resume;
* :mod:`~orchestra.experiments.freshness.llm_analysis` — the paired statistics (the chain's) and the report.
"""
