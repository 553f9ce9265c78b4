"""The bottom layer: the contract values shared with the Lua scripts and the SQL (statuses,
reasons, bounds), the Message type, schedules' rows and their cron and interval rules, the errors
and their answers, topic and namespace names, client addresses as the per-address limits count
them, clocks, the precise timer and the back-off of retried calls. Imports nothing of delayqueue."""
