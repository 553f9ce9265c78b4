"""camellia's health endpoints, for load balancers: the HTTP status is the answer."""
import orjson
from django.http import HttpResponse
from django.views import View

from delayqueue.api import health_state
from delayqueue.api.auth import authorize_host
from delayqueue.api.schema import health_endpoint
from delayqueue.api.views.base import QueueAPIView
from delayqueue.core.exceptions import error_answer


def health_reply(code: int) -> HttpResponse:
    """camellia's health answers: {"code": N} with the same HTTP status, for load balancers."""
    return HttpResponse(orjson.dumps({"code": code}), status=code,
                        content_type="application/json")


class HealthView(QueueAPIView):
    marks_use = False

    def handle_exception(self, exc):
        code, _msg = error_answer(self.queue_error(exc), type(self).__name__)
        return health_reply(code)


class LoadBalancerCheckView(HealthView):
    """Answers every method alike, as camellia maps them: load balancers check with HEAD, or
    (HAProxy's default) OPTIONS."""

    http_method_names = View.http_method_names


@health_endpoint("Is this host online",
                 "Answers 200 while this host reports itself online, 500 after /camellia/health/offline "
                 "(until /camellia/health/online).", failing="offline, or the check failed")
class HealthStatusView(LoadBalancerCheckView):
    async def handle(self):
        return health_reply(200 if await health_state.is_online(self.rt) else 500)


@health_endpoint("Is the process serving", "Answers 200 whenever the process serves requests.",
                 failing="the check failed")
class HealthCheckView(LoadBalancerCheckView):
    async def handle(self):
        return health_reply(200)


class HostOperatorView(HealthView):
    """A change to the whole host: the host operator's credential only (api/auth.py authorize_host),
    never a tenant's token."""

    host_operator = True  # for the API docs (api/schema.py)

    async def authorize_caller(self, root, request) -> None:
        await authorize_host(root, request)


@health_endpoint("Report this host online", "Makes /camellia/health/status answer 200 again.",
                 failing="the change failed (Redis, which keeps it for every worker of the host, unreachable)",
                 refusable=True)
class HealthOnlineView(HostOperatorView):

    async def handle(self):
        return health_reply(200 if await health_state.set_online(self.rt, True) else 500)


@health_endpoint("Report this host offline (to drain it)",
                 "Makes /camellia/health/status answer 500 so load balancers stop sending traffic. Answers "
                 "200 once no worker of this host has served a queue request (monitor reads aside) for 20 s, "
                 "else 500: call it again until it answers 200.",
                 failing="still serving queue requests, or the change failed (Redis, which keeps it for every "
                         "worker of the host, unreachable)", refusable=True)
class HealthOfflineView(HostOperatorView):

    async def handle(self):
        rt = self.rt
        kept = await health_state.set_online(rt, False)
        return health_reply(200 if kept and await health_state.idle(rt) else 500)
