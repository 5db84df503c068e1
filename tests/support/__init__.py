"""What several tests share: servers of their own (JupyterLab, PostgreSQL), free ports."""
