from django.http import HttpResponse
from django.urls import path

from project.urls import urlpatterns as service_urlpatterns


async def hello(request):
    return HttpResponse(b'{"code":200,"msg":"hello"}', content_type="application/json")


urlpatterns = [path("camellia/bench/hello", hello), *service_urlpatterns]
