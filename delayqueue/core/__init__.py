"""The bottom layer: contract values, the message type, errors, names, clocks; imports nothing of
delayqueue above it."""
