"""The operator's data: limits, topic settings, API tokens and push topics, each as a table a
process reads every half second (refreshed.py), and their changes through Django's ORM
(rows.py). Data and caches only: no action that takes a Runtime. Imports the layers below."""
