"""Multi-controller runs: processes that call one process-spanning function
agree on its signature on every miss (`agreement`)."""
