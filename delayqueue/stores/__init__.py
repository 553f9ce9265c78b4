"""Operator data (limits, topic settings, tokens, push topics) and the caches processes read it through."""
