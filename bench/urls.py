"""The product's URLs plus the baseline: a view doing exactly one INSERT per request."""

from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from agentplatform.urls import urlpatterns as product_urlpatterns

TABLE = "bench_insert"


@csrf_exempt
def one_insert(request: HttpRequest) -> HttpResponse:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {TABLE} (body) VALUES (%s)", [request.body[:200].decode()])
    return HttpResponse(status=202)


urlpatterns = [path("bench/insert/", one_insert), *product_urlpatterns]
handler404 = "agentplatform.api.errors.page_not_found"
handler500 = "agentplatform.api.errors.server_error"
