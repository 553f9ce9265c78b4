"""The references for sequential sends without the SDK (issue 18): a hand-written
`requests.Session` loop (keep-alive), one sendMsg after the other from one thread, to each server
(message log on, off); then the same with a bare `http.client` connection and pre-encoded bodies,
the least a client can add to a call."""
import http.client
import json
import time
import urllib.parse

import requests

from bench.harness import empty_redis
from bench.python_queues.common import Phases, show_rate
from bench.python_queues.delayqueue_side import FAR_DELAY_MS, with_log

API = "/camellia/delayQueue/"
REQUESTS, BARE = "requests loop", "bare http.client loop"


def rows(urls: dict, env: dict, phases: Phases) -> dict:
    measured = {}
    print("requests.Session loop, sequential sendMsg from one thread", flush=True)
    for log in ("on", "off"):
        empty_redis(env["REDIS_URL"])
        with requests.Session() as session:
            url = urls[log] + API + "sendMsg"
            session.post(url, data={"topic": "requests", "msg": "warm-up", "delayMillis": FAR_DELAY_MS})
            started = time.perf_counter()
            for i in range(phases.messages):
                answer = session.post(url, data={"topic": "requests", "msg": f"m{i}", "delayMillis": FAR_DELAY_MS}).json()
                assert answer["code"] == 200, answer
            measured[with_log("enqueue one", log), REQUESTS] = phases.messages / (time.perf_counter() - started)
        show_rate(f"log {log}", measured[with_log("enqueue one", log), REQUESTS])
    print("bare http.client loop, sequential sendMsg from one thread (no client library: the server's floor)",
          flush=True)
    for log in ("on", "off"):
        empty_redis(env["REDIS_URL"])
        address = urllib.parse.urlsplit(urls[log])
        connection = http.client.HTTPConnection(address.hostname, address.port)
        headers = {"Content-Type": "application/json"}
        bodies = [json.dumps({"topic": "bare", "msg": f"m{i}", "delayMillis": FAR_DELAY_MS})
                  for i in range(phases.messages)]
        started = time.perf_counter()
        for body in bodies:
            connection.request("POST", API + "sendMsg", body, headers)
            answer = json.loads(connection.getresponse().read())
            assert answer["code"] == 200, answer
        measured[with_log("enqueue one", log), BARE] = phases.messages / (time.perf_counter() - started)
        connection.close()
        show_rate(f"log {log}", measured[with_log("enqueue one", log), BARE])
    return measured
