"""Settings from the environment and the command line; imports only core."""
