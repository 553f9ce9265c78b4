"""Django settings. Every knob comes from an environment variable; README.md lists them."""
import os
from pathlib import Path

import dj_database_url

from delayqueue.arguments import MAX_AGE_DAYS
from delayqueue.live.store import checked_url
from project.env import env_bool, env_int, env_url

BASE_DIR = Path(__file__).resolve().parent.parent


DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY") or "insecure-dev-key-set-SECRET_KEY-in-production"
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "delayqueue",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

def postgres_database(url: str) -> dict:
    try:
        database = dj_database_url.parse(url, conn_max_age=60)
    except ValueError:
        database = {}
    if database.get("ENGINE") != "django.db.backends.postgresql":
        raise ValueError("must be a postgres://user:password@host:port/database URL (the message log is PostgreSQL)")
    return database


# The message log. Default matches the PostgreSQL that `./dev run` starts when DATABASE_URL is unset.
DATABASES = {"default": env_url("DATABASE_URL", "postgres://postgres@127.0.0.1:15432/delayqueue", postgres_database)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The live queue. redis://, rediss:// or redis-cluster://host:port[,host:port...].
REDIS_URL = env_url("REDIS_URL", "redis://127.0.0.1:16379/0", checked_url)

# django-redis as Django's cache on a single Redis; a cluster deployment keeps the cache per process.
if REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "dqcache",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Queue defaults (SPEC §2). "≤ 0 means default" rules are applied per request.
DELAYQUEUE = {
    "NAMESPACE": os.environ.get("DELAYQUEUE_NAMESPACE", "default"),
    "TTL_MILLIS": env_int("DELAYQUEUE_TTL_MILLIS", 3_600_000, minimum=1),
    "MAX_RETRY": env_int("DELAYQUEUE_MAX_RETRY", 10, minimum=0),
    "ACK_TIMEOUT_MILLIS": env_int("DELAYQUEUE_ACK_TIMEOUT_MILLIS", 30_000, minimum=1),
    "PULL_BATCH": env_int("DELAYQUEUE_PULL_BATCH", 1, minimum=1),
    "MAX_PULL_BATCH": env_int("DELAYQUEUE_MAX_PULL_BATCH", 1000, minimum=1),
    "LONG_POLLING_TIMEOUT_MILLIS": env_int("DELAYQUEUE_LONG_POLLING_TIMEOUT_MILLIS", 10_000, minimum=1),
    "MAX_LONG_POLLING_TIMEOUT_MILLIS": env_int("DELAYQUEUE_MAX_LONG_POLLING_TIMEOUT_MILLIS", 60_000, minimum=1),
    "ENDED_RETENTION_MILLIS": env_int("DELAYQUEUE_ENDED_RETENTION_MILLIS", 300_000, minimum=1),
    "MAX_MSG_BYTES": env_int("DELAYQUEUE_MAX_MSG_BYTES", 65_536, minimum=1),
    "MAX_BATCH_SEND": env_int("DELAYQUEUE_MAX_BATCH_SEND", 1000, minimum=1),
    "MONITOR_INTERVAL_SECONDS": env_int("DELAYQUEUE_MONITOR_INTERVAL_SECONDS", 60, minimum=1),
    "SCANNER_LOCK_TTL_MILLIS": env_int("DELAYQUEUE_SCANNER_LOCK_TTL_MILLIS", 5_000, minimum=100),
    "SCANNER_BATCH": env_int("DELAYQUEUE_SCANNER_BATCH", 1000, minimum=1),
    "TOPIC_IDLE_SECONDS": env_int("DELAYQUEUE_TOPIC_IDLE_SECONDS", 1800, minimum=1),
    "TOPIC_CHECK_SECONDS": env_int("DELAYQUEUE_TOPIC_CHECK_SECONDS", 600, minimum=1),
    # A Redis that stops answering (hung, paused, or a network that drops packets) fails the
    # calls waiting on it after this long, instead of holding them forever.
    "REDIS_TIMEOUT_MILLIS": env_int("DELAYQUEUE_REDIS_TIMEOUT_MILLIS", 10_000, minimum=1),
    # The PostgreSQL message log (README: "Message log"). Off: sends skip Postgres and the
    # scripts record no history; only for measuring what the log costs.
    "MESSAGE_LOG": env_bool("DELAYQUEUE_MESSAGE_LOG", True),
    "LOG_WRITER_INTERVAL_MILLIS": env_int("DELAYQUEUE_LOG_WRITER_INTERVAL_MILLIS", 100, minimum=1),
    "LOG_WRITER_BATCH": env_int("DELAYQUEUE_LOG_WRITER_BATCH", 5000, minimum=1),
    "LOG_RETENTION_DAYS": env_int("DELAYQUEUE_LOG_RETENTION_DAYS", 7, minimum=1, maximum=MAX_AGE_DAYS),
    # A statement on the log (a send waits for one) fails after this long, whether PostgreSQL
    # times it out or does not answer at all.
    "LOG_TIMEOUT_MILLIS": env_int("DELAYQUEUE_LOG_TIMEOUT_MILLIS", 30_000, minimum=1),
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# The OpenAPI schema (/api/schema/) and its browsable UIs, whose assets the sidecar app serves
# from our own static files: the docs work with no Internet access.
SPECTACULAR_SETTINGS = {
    "TITLE": "delayqueue API",
    "DESCRIPTION": "A delay queue compatible with camellia-delay-queue's HTTP API and Java SDK. Every queue "
                   "answer is HTTP 200 with the result in `code`: 200 done; otherwise the answer is only "
                   "`code` (400 bad parameter, 401 not authenticated, 403 not allowed, 404 not found, 429 "
                   "too many requests, 500 server error) and `msg`, saying what went wrong. The health "
                   "endpoints answer `{\"code\": N}` with N as the HTTP status. Times are in milliseconds, "
                   "sizes in bytes.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Request components of their own, so required text parameters say minLength 1 (answers need not).
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "delayqueue.api.schema.settings_limits",
    ],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# WhiteNoise serves static files straight from the installed apps: no collectstatic step.
WHITENOISE_USE_FINDERS = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}
