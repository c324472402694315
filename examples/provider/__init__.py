"""The example mail provider: a small HTTP service with idempotency keys (``stagedoor provider run``).

It stands in for a real email API so tests can count exactly what was
delivered.  It keeps its messages in its own schema (``provider``) of the
database it is given, apart from postbox's tables.
"""
