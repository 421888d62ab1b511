"""The specon node agent: one per worker; tails job logs, classifies, heartbeats, executes commands."""
