"""The orders app's jobs: found by the worker as an installed app's ``tasks`` module."""

from orders.models import Order, Receipt
from postbox import task


@task(queue="orders")
def send_receipt(ctx, order_id: int) -> None:
    order = Order.objects.get(pk=order_id)
    with ctx.atomic():  # the receipt commits with the job's success, once
        Receipt.objects.create(order=order, text=f"{order.total_cents / 100:.2f} EUR to {order.email}")


@task(queue="orders")
def audit_order(ctx, order_id: int) -> bool:
    """A read through the ORM outside any transaction of postbox's: Django's own connection of this thread."""
    return Order.objects.filter(pk=order_id).exists()
