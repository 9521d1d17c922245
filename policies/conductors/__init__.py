"""Conductors that need no training: the rule-based schedulers (``rule_based``), a person at the terminal
(``human``) and ε-random exploration around any conductor (``exploration``). The LLM conductor lives above the
backends it calls (:mod:`orchestra.runtime.llm_conductor`); learned ones are loaded by :mod:`policies.learning.learned`."""
