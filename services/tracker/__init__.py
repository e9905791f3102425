"""The tracker service: the run record in SQL, its HTTP API and (later) the dashboard."""
