"""Django settings. Every knob comes from an environment variable; README.md lists them, and
docs/deploy.md gives the values of a production deployment."""
import os
from pathlib import Path
from urllib.parse import quote

import dj_database_url

from delayqueue.config.env import env_bool, env_int, env_list, env_log_level
from delayqueue.config.redis_urls import is_cluster_url, is_sentinel_url, sentinel_target, url_credentials, url_nodes
from delayqueue.config.settings import QueueConfig
from delayqueue.core.exceptions import answer_codes_text

BASE_DIR = Path(__file__).resolve().parent.parent


DEBUG = env_bool("DEBUG", False)
# ./dev run keeps a generated key in .local/run/ (./dev manage passes it too), ./dev test makes
# one per run; anything else sets its own. A fixed fallback key would be public.
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise SystemExit("SECRET_KEY is not set: set it to a long random string, e.g. the output of "
                         "python3 -c 'import secrets; print(secrets.token_urlsafe(50))' "
                         "(./dev run and ./dev manage set one for the local stack)")
    SECRET_KEY = "insecure-debug-only-key"  # DEBUG only: never served to anyone but a developer
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")

# HTTPS behind a reverse proxy (docs/deploy.md). The defaults suit ./dev run's plain HTTP on
# 127.0.0.1; a deployment turns them on.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")
# The header the proxy sets to "https" for requests that came over TLS, e.g. X-Forwarded-Proto.
# Only behind a proxy that always sets it: a client could send it otherwise.
_proxy_ssl_header = os.environ.get("SECURE_PROXY_SSL_HEADER", "").strip()
SECURE_PROXY_SSL_HEADER = (f"HTTP_{_proxy_ssl_header.upper().replace('-', '_')}", "https") if _proxy_ssl_header else None
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# Prometheus scrapes the web process directly, over plain HTTP on the private network.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)

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

# The queue's settings (and the two URLs) as delayqueue/config/settings.py declares them.
_queue = QueueConfig.from_environment()

# The message log. Default matches the PostgreSQL that `./dev run` starts when DATABASE_URL is unset.
DATABASE_URL = _queue.database_url
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
# More databases for the log of the namespaces DELAYQUEUE_NAMESPACE_DATABASES routes to them
# (docs/scaling.md); each has every table, and holds the rows of those namespaces only.
DATABASES.update({alias: dj_database_url.parse(url, conn_max_age=60) for alias, url in _queue.log_database_urls.items()})
DATABASE_ROUTERS = ["delayqueue.messagelog.routing.NamespaceRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The live queue: any URL form of delayqueue/config/redis_urls.py (URL_FORMS).
REDIS_URL = _queue.redis_url

DELAYQUEUE = _queue.queue_settings()
# One cap on every request body (DELAYQUEUE_MAX_BODY_BYTES): Django checks it against Content-Length,
# delayqueue/api/asgi.py against what a chunked body really carries.
DATA_UPLOAD_MAX_MEMORY_SIZE = _queue.max_body_bytes

# django-redis as Django's cache on a single Redis (through its Sentinel if the URL names one);
# a cluster deployment keeps the cache per process. It holds the admin's sessions, the failed
# admin login counts and the dashboard's figures. A Redis outage must not take the admin down
# with it: cache calls then miss (sessions fall back to the database) after at most the queue's
# Redis timeout.
_cache_options = {
    "IGNORE_EXCEPTIONS": True,
    "SOCKET_CONNECT_TIMEOUT": _queue.redis_timeout,
    "SOCKET_TIMEOUT": _queue.redis_timeout,
}
if is_sentinel_url(REDIS_URL):
    _service, _db, _sentinel_auth = sentinel_target(REDIS_URL)
    _password = url_credentials(REDIS_URL).get("password")
    _cache_location = f"redis://{':' + quote(_password, safe='') + '@' if _password else ''}{_service}/{_db}"
    _cache_options.update(
        CLIENT_CLASS="django_redis.client.SentinelClient",
        CONNECTION_FACTORY="django_redis.pool.SentinelConnectionFactory",
        SENTINELS=url_nodes(REDIS_URL),
        SENTINEL_KWARGS={"socket_timeout": _queue.redis_timeout, **_sentinel_auth},
    )
else:
    _cache_location = REDIS_URL
if is_cluster_url(REDIS_URL):
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
else:
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": _cache_location,
            "KEY_PREFIX": "dqcache",
            "OPTIONS": _cache_options,
        }
    }

# Sessions in the cache and the database: a session outlives a cache loss, and one process's
# login holds in every other even when each has its own cache (Redis Cluster deployments).
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

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
                   "answer is HTTP 200 with the result in `code`: 200 done; otherwise the answer is `code` "
                   f"({answer_codes_text()}) and `msg`, saying what went wrong, and with code 429 "
                   "`retryAfterMillis`. The health endpoints answer `{\"code\": N}` with N as the HTTP status. "
                   "Times are in milliseconds, sizes in bytes.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Request components of their own, so required text parameters say minLength 1 (answers need not).
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "delayqueue.api.schema.settings_limits",
        "delayqueue.api.schema.parameter_rules",
        "delayqueue.api.schema.token_security",
    ],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Debug error pages (DEBUG on) hide the passwords inside the datastores' URLs too.
DEFAULT_EXCEPTION_REPORTER_FILTER = "delayqueue.ops.error_pages.PasswordHidingFilter"

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
    "root": {"handlers": ["console"], "level": env_log_level("LOG_LEVEL", "INFO")},
}
