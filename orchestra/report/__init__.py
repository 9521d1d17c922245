"""Reading results: evaluation statistics and tables (``evaluation``, their rows in ``rows``), plots (``plots``) and
plain-text views of trajectories and datasets (``summaries``)."""
