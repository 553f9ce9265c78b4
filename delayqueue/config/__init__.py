"""The settings: each environment variable declared once with its default and bounds
(settings.py), the Redis URL forms, the allowed push hosts, and the command lines' option types.
Imports core only."""
