"""Learning a conductor from data: the offline dataset of conductor decisions (``dataset``, ``minari_io``), offline RL
and FQE with d3rlpy (``offline``), online MaskablePPO behind safety rails (``online``), distillation into readable
rules (``distill``), the checkpoint format every learned conductor shares (``checkpoint``, ``learned``: load any of
them by its algorithm) and the resumable training state (``train_state``)."""
