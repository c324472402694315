"""Stagedoor: the ticket shop that shows postbox's exactly-once effects.

``orders`` places orders (the producer side); ``tasks`` holds the four jobs
that workers run (``POSTBOX_TASKS=postbox_examples.stagedoor.tasks``).
"""
