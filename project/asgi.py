import gc
import logging
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does

from delayqueue.api.asgi import BoundedASGIHandler, EventLoopAPIHandler, strip_token_prefix  # noqa: E402  (needs Django set up)
from delayqueue.config.settings import HOST_TOKEN_MIN_LENGTH, load_config  # noqa: E402

_config = load_config()
if _config.auth == "open":
    logging.getLogger("delayqueue").warning(
        "DELAYQUEUE_AUTH=open: the queue API takes no token, anyone who reaches it may do anything in namespace %s",
        _config.namespace)
# Not refused (a deployment running with one would stop starting), but guessable: wrong guesses
# are only slowed per address (DELAYQUEUE_AUTH_FAILURE_LIMIT).
if 0 < len(_config.metrics_token) < HOST_TOKEN_MIN_LENGTH:
    logging.getLogger("delayqueue").warning(
        "DELAYQUEUE_METRICS_TOKEN has %d characters: a token of fewer than %d can be guessed, make one with "
        "openssl rand -hex 32", len(_config.metrics_token), HOST_TOKEN_MIN_LENGTH)

# Serves the admin and the rest, with the queue API's bounds on bodies.
django_application = BoundedASGIHandler()
# Paths served without leaving the event loop: async views that never use the ORM.
EVENT_LOOP_PATHS = ("/camellia/",)
# /t/<token>/camellia/...: the API token as a path prefix, for clients that cannot set headers.
TOKEN_PATH_PREFIX = "/t/"
api_application = EventLoopAPIHandler()

# Everything loaded so far lives as long as the process: keep it out of the cyclic collector,
# whose full passes over Django's heap otherwise stall every request for tens of ms.
gc.freeze()


async def application(scope, receive, send):
    if scope["type"] == "websocket":  # served nowhere: closed before accepting is HTTP 403, where Django's
        await send({"type": "websocket.close"})  # handler raises ValueError (HTTP 500, a traceback logged)
        return
    if scope["type"] == "http" and scope["path"].startswith(TOKEN_PATH_PREFIX):
        strip_token_prefix(scope)  # /t/<token>/ outside the queue API becomes /t/-/, which is no page
    if scope["type"] == "http" and scope["path"].startswith(EVENT_LOOP_PATHS):
        await api_application(scope, receive, send)
    else:
        await django_application(scope, receive, send)
