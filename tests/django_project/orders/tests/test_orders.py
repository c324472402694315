"""The orders app's tests, as a Django team writes them (pytest-django)."""

import pytest
from django.db import connection

import postbox.testing
from orders.models import Order
from orders.tasks import send_receipt


def place(client, email="ada@example.com", total_cents=1250):
    response = client.post("/orders/", {"email": email, "total_cents": total_cents}, content_type="application/json")
    assert response.status_code == 201
    return response.json()["id"]


@pytest.mark.django_db
def test_placing_an_order_enqueues_its_receipt(client):
    order_id = place(client)

    postbox.testing.assert_enqueued(connection, send_receipt, args={"order_id": order_id}, count=1)


@pytest.mark.django_db
def test_a_refused_order_enqueues_nothing(client):
    with pytest.raises(KeyError):
        client.post("/orders/", {"email": "ada@example.com"}, content_type="application/json")

    assert Order.objects.count() == 0
    postbox.testing.assert_not_enqueued(connection, send_receipt)


@pytest.mark.django_db(transaction=True)
def test_the_order_and_its_job_commit_together(client):
    """A committed order: its one job is in postbox's outbox (Django's flush empties it after the test)."""
    order_id = place(client)

    with connection.cursor() as cursor:
        cursor.execute("SELECT task, args->>'order_id' FROM postbox.outbox ORDER BY id")
        assert cursor.fetchall() == [("send_receipt", str(order_id))]
