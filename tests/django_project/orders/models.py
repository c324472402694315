from django.db import models


class Order(models.Model):
    email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)


class Receipt(models.Model):
    """Written once per order by ``send_receipt``: the job's effect, counted by the tests."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    text = models.TextField()
