"""The background workers `manage.py run_scanners` runs per namespace: the scanner and its topic
workers, the loader, the pusher (and its HTTP side), the redriver; and, in its log process, the
log writer and the schedule planner. Imports the services and the layers below them."""
