"""Redis, the live queue: key names, the connections and script runners, and the Lua scripts
with one Python builder each (scripts.py), with the formats they share with Python (the stats
hash, the event stream, the stored message). Imports core and config."""
