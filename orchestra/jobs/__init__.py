"""What each command does, given its resolved config: one module per job (record, evaluate, inspect, phase 1 and its
steps, the conductor's online PPO, TeamTR fine-tuning, Stage-0 alignment, the experiments, the demo). A job takes a
config dataclass declared next to it and writes a run directory; the command line (:mod:`orchestra.cli`) only parses
flags into that config."""
