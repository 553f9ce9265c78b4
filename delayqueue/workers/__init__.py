"""The background workers `manage.py run_scanners` runs per namespace: the scanner and its topic
workers, the log writer, the loader, the pusher (and its HTTP side), the redriver and the schedule
planner. Imports the services
and the layers below them."""
