"""Scripts the tests run in subprocesses."""
