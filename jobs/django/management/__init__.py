"""``manage.py`` commands of ``postbox.django``: ``postbox`` and ``flush``."""
