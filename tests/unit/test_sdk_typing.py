"""The SDK's annotations: mypy --strict finds nothing in the package (sdk/python/pyproject.toml's
[tool.mypy]), the package ships py.typed, and AsyncClient's methods are typed as awaitables of
what Client's answer (a user's type checker sees the real async signatures)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk" / "python"
PACKAGE = SDK / "delayqueue_client"
# Ignored by git; later runs check only what changed. One cache a test: two mypy processes on one
# cache (the tests on two xdist workers) stopped one with an INTERNAL ERROR, 1 time in 4.
CACHE = ROOT / ".local" / "mypy-cache"


def mypy(*args: str, cwd: Path, cache: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(SDK / "pyproject.toml"),
                           "--cache-dir", str(CACHE / cache), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_mypy_strict_finds_nothing_in_the_sdk():
    result = mypy(str(PACKAGE), cwd=SDK, cache="sdk")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_the_package_ships_py_typed():
    assert (PACKAGE / "py.typed").is_file()
    assert 'delayqueue_client = ["py.typed"]' in (SDK / "pyproject.toml").read_text()


USER_CODE = '''
from delayqueue_client import AsyncClient, Client, Message

def blocking(client: Client) -> Message | None:
    reveal_type(client.pull("t", batch=2))
    return client.get("t", "m")

async def asynchronous(client: AsyncClient) -> list[Message]:
    reveal_type(client.send("t", "m"))
    await client.pull("t", batchsize=2)
    return await client.pull("t", batch=2)
'''


def test_async_methods_are_typed_as_awaitables_of_the_blocking_answers(tmp_path):
    (tmp_path / "user.py").write_text(USER_CODE)
    result = mypy("user.py", cwd=tmp_path, cache="user")
    revealed = [line.split("Revealed type is ")[1] for line in result.stdout.splitlines() if "Revealed type" in line]
    assert revealed == ['"list[delayqueue_client.message.Message]"',
                        '"typing.Coroutine[Any, Any, delayqueue_client.message.Message]"'], result.stdout
    assert 'Unexpected keyword argument "batchsize"' in result.stdout  # the real parameters, checked
    assert result.stdout.count("error:") == 2, result.stdout  # that one, and the un-awaited send
