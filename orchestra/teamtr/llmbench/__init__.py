"""``orchestra bench finetune``: the real-LLM comparison of TeamTR with naive, joint and HAPPO against the frozen team
(:mod:`~orchestra.teamtr.llmbench.config`, :mod:`~orchestra.teamtr.llmbench.run`,
:mod:`~orchestra.teamtr.llmbench.analysis`, :mod:`~orchestra.teamtr.llmbench.report`)."""
