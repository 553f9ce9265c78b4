"""The queue's actions, one module per kind: sending (with admission under the limits), consuming
(pulls, long polls, acks, nacks, touches: for the HTTP API and the pushers alike), single
messages, topics (settings, pause, purge, sizes and counters), restoring from the message log,
and dead letters. Keyword-only functions taking a Runtime, called alike by the API, the
management commands, the admin, the workers and the Spark jobs. Imports the runtime and the
layers below it."""
