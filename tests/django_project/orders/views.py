import json
import os

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import postbox
from orders.models import Order
from orders.tasks import send_receipt


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    with transaction.atomic():  # the order and its receipt job commit together, or neither
        order = Order.objects.create(email=body["email"], total_cents=body["total_cents"])
        if not os.environ.get("ORDERS_SKIP_RECEIPT"):  # a fault switch for the repository's test only
            postbox.enqueue(connection, send_receipt, {"order_id": order.pk})
    return JsonResponse({"id": order.pk}, status=201)
