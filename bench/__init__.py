"""Benchmarks (README "Benchmarks"). Their servers run with DEBUG off, which needs a SECRET_KEY:
a random one, unless one is set, for this process and the processes it starts."""
import os
import secrets

os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
