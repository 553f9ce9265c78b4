"""The bottom layer: the contract values shared with the Lua scripts and the SQL (statuses,
reasons, bounds), the Message type, the errors and their answers, topic and namespace names,
clocks and the precise timer. Imports nothing of delayqueue."""
