"""Settings of the sample project. The database and Redis come from ORDERS_* variables (the test sets them)."""

import os

SECRET_KEY = "sample-project-only"
DEBUG = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "shop.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "postbox.django",
    "orders",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("ORDERS_DB_NAME", "orders"),
        "USER": os.environ.get("ORDERS_DB_USER", "postgres"),
        "HOST": os.environ.get("ORDERS_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("ORDERS_DB_PORT", "5432"),
        "CONN_MAX_AGE": int(os.environ.get("ORDERS_CONN_MAX_AGE", "0")),
        # Django's own connections are told apart from postbox's in pg_stat_activity.
        "OPTIONS": {"application_name": "orders-django"},
        "TEST": {"NAME": os.environ.get("ORDERS_TEST_DB_NAME")},  # None: Django's test_<NAME>
    }
}

# postbox's settings (docs/configuration.md, without the POSTBOX_ prefix). The database is
# DATABASES["default"]; the task modules are the installed apps' tasks modules (orders.tasks).
POSTBOX = {
    "REDIS_URL": os.environ.get("ORDERS_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "REDIS_PREFIX": os.environ.get("ORDERS_REDIS_PREFIX", "orders"),
    "CONCURRENCY": int(os.environ.get("ORDERS_CONCURRENCY", "4")),
}

LOGGING = {"version": 1, "disable_existing_loggers": False}
