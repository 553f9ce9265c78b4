"""The management commands (management/commands/): the service's command lines, the top layer
with apps.py. Imports every layer."""
