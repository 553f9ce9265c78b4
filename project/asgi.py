import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

django_application = get_asgi_application()  # sets Django up; serves the admin and the rest

from delayqueue.api.asgi import EventLoopAPIHandler  # noqa: E402  (needs Django set up)

# Paths served without leaving the event loop: async views that never use the ORM.
EVENT_LOOP_PATHS = ("/camellia/",)
api_application = EventLoopAPIHandler()

# Everything loaded so far lives as long as the process: keep it out of the cyclic collector,
# whose full passes over Django's heap otherwise stall every request for tens of ms.
gc.freeze()


async def application(scope, receive, send):
    if scope["type"] == "http" and scope["path"].startswith(EVENT_LOOP_PATHS):
        await api_application(scope, receive, send)
    else:
        await django_application(scope, receive, send)
