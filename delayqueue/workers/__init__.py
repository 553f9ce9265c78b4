"""The background workers `manage.py run_scanners` runs per namespace: the scanner and its topic
workers, the log writer, the pusher (and its HTTP side) and the redriver. Imports the services
and the layers below them."""
