"""Reading results: evaluation statistics and tables (``evaluation``), plots (``plots``) and plain-text views of
trajectories and datasets (``summaries``)."""
