"""Push delivery: the service POSTs a topic's due messages to its push URL (docs/push.md).

hosts.py decides which URLs may be set and which addresses a push may connect to; pusher.py
is the pusher run_scanners runs beside each namespace's scanner; topics.py its table of push
topics and their signing secrets; figures.py the push counts /metrics and the dashboard show."""
