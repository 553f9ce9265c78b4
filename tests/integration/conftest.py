"""Integration tests run on the servers `./dev test` starts; their fixtures are in tests/conftest.py."""
from tests.helpers import require_servers

require_servers()
