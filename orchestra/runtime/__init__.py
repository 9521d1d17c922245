"""What every job runs on: team files (``team_file``), workers, sessions, the rollout engine, the conductor's
Gymnasium view with safety rails, the conductor registry and the LLM conductor."""
