"""The experiments of phase 2: TeamTR against naive, joint and HAPPO, over paired seeds (``orchestra experiment``).

* :mod:`~orchestra.experiments.harness` — what both share: the accountings, the resumable rows file, the tables and
  ``summary.md`` (the experiment harness);
* :mod:`~orchestra.experiments.chain` — on the telephone chain, where team success and drift are exact
  (``orchestra experiment chain``);
* :mod:`~orchestra.experiments.llm` — on a real LLM team against the frozen team, on held-out tasks
  (``orchestra experiment llm``).

They use the algorithm (:mod:`orchestra.teamtr`); the algorithm never imports them.
"""
