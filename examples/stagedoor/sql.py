"""Every statement on Stagedoor's tables, named; parameters only, no SQL built from strings.

Time-sensitive statements take ``%(now)s`` and use ``coalesce(%(now)s, now())``:
production passes ``None`` (the database clock decides), tests pass a time.
"""

from __future__ import annotations

from typing import LiteralString

# --- events ----------------------------------------------------------------------

INSERT_EVENT: LiteralString = """
    INSERT INTO stagedoor.events (name, capacity) VALUES (%(name)s, %(capacity)s)
 RETURNING id, name, capacity, seats_reserved, seats_sold, created_at
"""

SELECT_EVENT: LiteralString = """
    SELECT id, name, capacity, seats_reserved, seats_sold, created_at FROM stagedoor.events WHERE id = %(id)s
"""

# Check and reserve in one statement: the row lock serialises concurrent orders,
# so two buyers can never both take the last seat.  Returns the seat range.
RESERVE_SEATS: LiteralString = """
    UPDATE stagedoor.events SET seats_reserved = seats_reserved + %(seats)s
     WHERE id = %(event_id)s AND seats_reserved + %(seats)s <= capacity
 RETURNING seats_reserved - %(seats)s + 1 AS first_seat, name
"""

SELECT_EVENT_SEATS: LiteralString = """
    SELECT capacity, seats_reserved FROM stagedoor.events WHERE id = %(event_id)s
"""

# --- orders and tickets ---------------------------------------------------------------

INSERT_ORDER: LiteralString = """
    INSERT INTO stagedoor.orders (public_id, event_id, seats, email)
    VALUES (%(public_id)s, %(event_id)s, %(seats)s, %(email)s)
 RETURNING id, created_at
"""

INSERT_TICKETS: LiteralString = """
    INSERT INTO stagedoor.tickets (order_id, seat)
    SELECT %(order_id)s, s FROM generate_series(%(first_seat)s::int, %(first_seat)s::int + %(seats)s::int - 1) AS s
"""

# The order as the jobs need it; pdf_keys holds the distinct non-null keys.
SELECT_ORDER: LiteralString = """
    SELECT o.id, o.public_id, o.seats, o.email, o.created_at, e.id AS event_id, e.name AS event_name,
           array_agg(t.seat ORDER BY t.seat) AS seat_numbers,
           count(t.pdf_key) AS rendered,
           min(t.pdf_key) AS pdf_key
      FROM stagedoor.orders o
      JOIN stagedoor.events e ON e.id = o.event_id
      JOIN stagedoor.tickets t ON t.order_id = o.id
     WHERE o.id = %(order_id)s
  GROUP BY o.id, e.id
"""

# Technique 1: only the run whose UPDATE matched goes on to queue the email.
SET_PDF_KEY: LiteralString = """
    UPDATE stagedoor.tickets SET pdf_key = %(pdf_key)s WHERE order_id = %(order_id)s AND pdf_key IS NULL
"""

# --- email sends (technique 2) ------------------------------------------------------

# Claim the send.  A row comes back only to the run that inserted it or that
# took over a stale, unsent claim; everyone else gets nothing.
CLAIM_SEND: LiteralString = """
    INSERT INTO stagedoor.email_sends AS s (order_id, kind, claimed_at, claimed_by)
    VALUES (%(order_id)s, %(kind)s, coalesce(%(now)s, now()), %(claimed_by)s)
    ON CONFLICT (order_id, kind) DO UPDATE
       SET claimed_at = excluded.claimed_at, claimed_by = excluded.claimed_by
     WHERE s.sent_at IS NULL
       AND s.claimed_at < coalesce(%(now)s, now()) - make_interval(secs => %(claim_ttl)s)
 RETURNING s.claimed_at
"""

SELECT_SEND: LiteralString = """
    SELECT claimed_at, claimed_by, sent_at FROM stagedoor.email_sends WHERE order_id = %(order_id)s AND kind = %(kind)s
"""

MARK_SENT: LiteralString = """
    UPDATE stagedoor.email_sends SET sent_at = coalesce(%(now)s, now()), provider_message_id = %(message_id)s
     WHERE order_id = %(order_id)s AND kind = %(kind)s AND sent_at IS NULL
"""

# A claim whose provider call failed (and was answered, so nothing is in doubt
# on our side) is given up at once, so the retry need not wait for it to go stale.
RELEASE_CLAIM: LiteralString = """
    UPDATE stagedoor.email_sends SET claimed_at = 'epoch', claimed_by = NULL
     WHERE order_id = %(order_id)s AND kind = %(kind)s AND sent_at IS NULL AND claimed_by = %(claimed_by)s
"""

# --- sales counter (technique 4) ----------------------------------------------------

ADD_SALES: LiteralString = """
    UPDATE stagedoor.events e SET seats_sold = e.seats_sold + o.seats
      FROM stagedoor.orders o
     WHERE o.id = %(order_id)s AND e.id = o.event_id
"""
