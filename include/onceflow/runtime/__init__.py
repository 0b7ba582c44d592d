"""The streaming runtime: launching the job, its supervisor, start/stop/status, preflight."""
