"""postbox in a Django project: add ``"postbox.django"`` to ``INSTALLED_APPS``.

What the app does (docs/in-your-application.md, Django):

- postbox's processes (``postbox worker run``, ``relay run``, ``api run``) started
  with ``DJANGO_SETTINGS_MODULE`` set call ``django.setup()`` before reading
  their settings and importing task modules (:mod:`postbox.django.bootstrap`);
  ``manage.py postbox worker run`` is the same command run through Django.
- Settings may come from ``settings.POSTBOX`` and the database from
  ``DATABASES["default"]``; the environment wins (:mod:`postbox.django.conf`).
- A worker closes its handler threads' obsolete Django connections before and
  after each sync job, as Django does around each request
  (:mod:`postbox.django.connections`).
- ``manage.py migrate`` (and so a test database's creation) brings postbox's
  schema to head; ``manage.py flush`` (and so ``TransactionTestCase``) empties
  postbox's tables with Django's (:mod:`postbox.django.database`).

Importing this package imports nothing of Django: postbox's core imports it only
when the process is a Django one.
"""
