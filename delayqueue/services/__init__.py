"""The queue's actions, one module per kind: sending with its admission under the limits,
consuming (pulls, long polls, acks, nacks, touches: for the HTTP API and the pushers alike),
single messages, topics and their settings, restoring from the message log, dead letters,
schedules.
Keyword-only functions taking a Runtime and answering Messages and typed replies, called alike
by the API, the commands, the admin, the workers and the Spark jobs. Imports the runtime and
the layers below it."""
