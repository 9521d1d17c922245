"""``orchestra experiment llm``: the real-LLM comparison of TeamTR with naive, joint and HAPPO against the frozen team
(:mod:`~orchestra.experiments.llm.config`, :mod:`~orchestra.experiments.llm.run`,
:mod:`~orchestra.experiments.llm.analysis`, :mod:`~orchestra.experiments.llm.report`)."""
