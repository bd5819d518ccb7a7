"""Settings: every knob comes from the environment, with an embedded default.

With nothing set, collab runs on SQLite (WAL), the in-memory channel layer and the
default model endpoint described in docs/wire.md. See README.md "Configuration".
"""

from __future__ import annotations

import ipaddress
import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from collab import oidc_settings

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default


def env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={raw!r}: write 1 or 0.")


DEBUG = env("DJANGO_DEBUG") == "1"
# The key signs sessions and CSRF tokens: it comes from the environment, the same on every
# process. Who sets it: the operator (production), manage.py (every command, `make run`
# included: the key kept in .cache/secret_key, collab/deploy.py), the test suite
# (tests/environment.py). A server started on collab.asgi without it refuses to start;
# only DJANGO_DEBUG=1 falls back to a fixed development key ("django-insecure-": `check
# --deploy` flags it).
SECRET_KEY = env("DJANGO_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set. Set it in the environment of every server process, the "
            "same on all (e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(50))'); "
            "see README.md, Deploying. `make run` and manage.py keep a local one in .cache/secret_key."
        )
    SECRET_KEY = "django-insecure-collab-development-only"

ALLOWED_HOSTS = [h.strip() for h in env("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [o for o in env("CSRF_TRUSTED_ORIGINS").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "axes",
    # Sign-in through OpenID Connect providers (docs/architecture/sign-in.md).
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "collab.chat",
    "collab.signin",
    "collab.simulator",
    "collab.loadtest",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks
]

ROOT_URLCONF = "collab.urls"
ASGI_APPLICATION = "collab.asgi.application"

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
                "collab.signin.context.sign_in",
            ],
        },
    }
]

# --- Database -------------------------------------------------------------------
_sqlite_path = env("COLLAB_SQLITE_PATH", str(BASE_DIR / "db.sqlite3"))
if env("DATABASE_URL"):
    # A pool, not persistent connections: database_sync_to_async closes its connection
    # after every call (docs/benchmarks/2026-12-02.md#b-first-profile), and under ASGI each
    # HTTP request runs in a thread of its own, whose persistent connection would stay open
    # until garbage-collected. Closing returns a pooled one (docs/architecture.md#a-database).
    _db: dict[str, Any] = dict(dj_database_url.parse(env("DATABASE_URL")))
    if _db["ENGINE"] == "django.db.backends.postgresql":
        _db["CONN_MAX_AGE"] = 0
        _db.setdefault("OPTIONS", {})["pool"] = {
            "min_size": 2,
            "max_size": int(env("COLLAB_DB_POOL_SIZE", "20")),
            "timeout": 10,
        }
    DATABASES: dict[str, dict[str, Any]] = {"default": _db}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _sqlite_path,
            "CONN_MAX_AGE": 600,  # reopening SQLite (and its PRAGMAs) per call costs ~12% of the DB thread
            "OPTIONS": {
                # IMMEDIATE: a write transaction takes the lock at BEGIN, so two concurrent
                # posts queue on busy_timeout instead of failing on a lock upgrade.
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": env("COLLAB_SQLITE_TEST_PATH", str(BASE_DIR / ".test-db.sqlite3"))},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channel layer --------------------------------------------------------------
REDIS_URL = env("REDIS_URL")
# Several Redis servers, comma separated (the same list, in the same order, on every
# process): the channel layer shards its channels and groups over them, the shared state
# its rooms and replies (docs/architecture.md#a-sharding). One URL: one server, as ever.
REDIS_URLS = [u.strip() for u in REDIS_URL.split(",") if u.strip()]
# State shared by the server processes (collab/chat/shared/): live replies, leases, rate
# limits, presence. In Redis whenever the channel layer is, else in this process's memory;
# a comma-separated list shards it (collab/chat/shared/sharded.py).
COLLAB_SHARED_REDIS_URL = env("COLLAB_SHARED_REDIS_URL", REDIS_URL)
# Every key collab writes in Redis, the channel layer's included, starts with this: two
# deployments (or test runs) can share one Redis.
COLLAB_REDIS_PREFIX = env("COLLAB_REDIS_PREFIX", "collab:")
# Pub/sub: several times the group_sends/s of the list-based layer, lower latency, and no
# silent drop at `capacity` (docs/benchmarks/2026-12-02.md#b-channel-layers).
# COLLAB_REDIS_LAYER=core picks the list-based one (the `naive` load-test scenario does).
_redis_layer = env("COLLAB_REDIS_LAYER", "pubsub")
if REDIS_URL:
    CHANNEL_LAYERS: dict[str, dict[str, Any]] = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer"
            if _redis_layer == "core"
            else "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": REDIS_URLS, "prefix": COLLAB_REDIS_PREFIX + "asgi"},
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            # Per-socket queue. A consumer only forwards frames (it never blocks), so its
            # queue stays near empty; 5000 is ~2.5 minutes of one reply's frames.
            "CONFIG": {"capacity": 5000},
        }
    }

# --- Auth -----------------------------------------------------------------------
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "rooms"
LOGOUT_REDIRECT_URL = "login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Login throttling (django-axes, collab/throttle.py): after AXES_FAILURE_LIMIT wrong
# passwords for one account from one address, that account waits AXES_COOLOFF_TIME there;
# the address alone, for every account, only after COLLAB_LOGIN_ADDRESS_FAILURES (many
# accounts tried), so one colleague's typos do not lock out a team behind one NAT. Never
# the account everywhere: a stranger elsewhere cannot lock the real user out. The client
# address is REMOTE_ADDR (Daphne sets it from X-Forwarded-For behind the proxy, `--proxy-headers`).
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_HANDLER = "collab.throttle.AccountAndAddressHandler"
AXES_FAILURE_LIMIT = env_int("COLLAB_LOGIN_FAILURES", 10)
COLLAB_LOGIN_ADDRESS_FAILURES = env_int("COLLAB_LOGIN_ADDRESS_FAILURES", 100)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("COLLAB_LOGIN_COOLOFF_MIN", 10))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]  # collab/throttle.py reads them in this order
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked.html"
AXES_VERBOSE = False
SESSION_COOKIE_HTTPONLY = True
# Lax, not Strict: the provider's redirect back to the callback is a cross-site navigation
# that must carry the session holding the sign-in's state (docs/architecture/sign-in.md).
SESSION_COOKIE_SAMESITE = "Lax"

# Single sign-on (README "Signing in through your identity provider"): OpenID Connect
# providers from COLLAB_OIDC_* (collab/oidc_settings.py), through django-allauth, whose
# settings-based APPS keep providers and secrets out of the database. COLLAB_PASSWORD_LOGIN=0:
# the providers are the only way in (no password form, no admin password login, no signup).
COLLAB_PASSWORD_LOGIN = env_flag("COLLAB_PASSWORD_LOGIN", default=True)
# The ID token's exp, iat and nbf are checked with this much leeway for clocks that differ.
COLLAB_OIDC_CLOCK_SKEW_S = env_int("COLLAB_OIDC_CLOCK_SKEW_S", 60)
SOCIALACCOUNT_PROVIDERS: dict[str, Any] = {
    "openid_connect": {
        "provider_class": "collab.signin.oidc.Provider",
        "APPS": oidc_settings.providers_from_env(os.environ),
    }
}
if COLLAB_PASSWORD_LOGIN is False and not SOCIALACCOUNT_PROVIDERS["openid_connect"]["APPS"]:
    raise ImproperlyConfigured("COLLAB_PASSWORD_LOGIN=0 needs at least one provider in COLLAB_OIDC_PROVIDERS.")
ACCOUNT_ADAPTER = "collab.signin.adapters.AccountAdapter"
SOCIALACCOUNT_ADAPTER = "collab.signin.adapters.SocialAccountAdapter"
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_STORE_TOKENS = False  # no access or refresh token is kept
ACCOUNT_EMAIL_VERIFICATION = SOCIALACCOUNT_EMAIL_VERIFICATION = "none"  # the provider's word decides (adapters.py)
SOCIALACCOUNT_LOGIN_ON_GET = False  # a GET to a provider's login URL shows a button: no login CSRF

# --- HTTPS ----------------------------------------------------------------------
# COLLAB_HTTPS: the site is served over HTTPS, here or by a proxy in front (deploy/nginx.conf
# sets X-Forwarded-Proto; Daphne's --proxy-headers reads it too). On by default, off with
# DJANGO_DEBUG=1; plain-http runs say COLLAB_HTTPS=0 (`manage.py serve`, the test suite
# and the load test do, on loopback). On: http redirects to https (but /healthz and
# /metrics, which local checks call on a worker's port), cookies are Secure, HSTS for a year.
COLLAB_HTTPS = env_flag("COLLAB_HTTPS", default=not DEBUG)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = COLLAB_HTTPS
if COLLAB_HTTPS:
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
    # Trusted only because every worker listens on loopback behind nginx, which sets the
    # header on every request (never passing on the client's own).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = 365 * 24 * 3600
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    # The preload flag only allows a submission to the browsers' list (by the domain's
    # owner, at hstspreload.org); it submits nothing.
    SECURE_HSTS_PRELOAD = True

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env("COLLAB_STATIC_ROOT", str(BASE_DIR / ".staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on a missing root
STATICFILES_DIRS = [BASE_DIR / "static"]
# Members' files (collab/chat/file_models.py): this folder unless a deployment configures
# another storage (docs/architecture/files.md).
MEDIA_ROOT = Path(env("COLLAB_MEDIA_ROOT", str(BASE_DIR / "media")))
STORAGES: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# An S3-compatible store instead (AWS, MinIO, Ceph, R2 ...): private objects, read through
# presigned URLs the file view hands to members only. The credentials come from boto3's
# own chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, an instance role): never
# from these settings, the database or the logs.
COLLAB_S3_BUCKET = env("COLLAB_S3_BUCKET")
if COLLAB_S3_BUCKET:
    STORAGES["default"] = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": COLLAB_S3_BUCKET,
            "endpoint_url": env("COLLAB_S3_ENDPOINT_URL") or None,
            "region_name": env("COLLAB_S3_REGION") or None,
            "default_acl": "private",
            "querystring_auth": True,
            "file_overwrite": False,
        },
    }
# How long a presigned URL of a file lives (S3 only): the member's browser follows it at once.
COLLAB_FILES_URL_EXPIRE_S = env_int("COLLAB_FILES_URL_EXPIRE_S", 60)
# Behind nginx: the file view answers with `X-Accel-Redirect: <this prefix>/<stored name>`
# and nginx sends the bytes from its internal location (deploy/nginx.conf); "" = Django sends them.
COLLAB_FILES_ACCEL = env("COLLAB_FILES_ACCEL")
# Uploads past COLLAB["MAX_FILE_BYTES"] are refused before they are parsed (collab/chat/files/handlers.py).
FILE_UPLOAD_HANDLERS = [
    "collab.chat.files.handlers.CappedUploadHandler",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]
# Serve from the app folders without collectstatic, so `make run` needs no build step.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # django-axes logs several INFO lines per login (issue 34): DEBUG here; its warnings stay.
    "filters": {"quiet_libraries": {"()": "collab.logfilters.InfoAsDebug", "prefixes": ["axes"]}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["quiet_libraries"]}},
    "root": {"handlers": ["console"], "level": env("COLLAB_LOG_LEVEL", "INFO")},
    "loggers": {
        # httpx logs every request line at INFO; keep the console for our own events.
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
    },
}

# --- collab ---------------------------------------------------------------------
# Default model endpoint (docs/wire.md). With none set: the embedded local model.
COLLAB_LLM_BASE_URL = env("COLLAB_LLM_BASE_URL")
# This server as model providers reach it (https://chat.example.org): the base of the signed
# links to images for a provider that fetches them (Provider.image_delivery "url").
COLLAB_PUBLIC_URL = env("COLLAB_PUBLIC_URL").rstrip("/")
COLLAB_LLM_API_KEY_ENV = "COLLAB_LLM_API_KEY"  # the key's *name*; its value is never stored
COLLAB_LLM_MODEL = env("COLLAB_LLM_MODEL")
COLLAB_LOCAL_MODEL_URL = env("COLLAB_LOCAL_MODEL_URL", "http://127.0.0.1:8088/v1")

# Outbound calls of staff-registered tools (collab/chat/egress.py): public addresses only,
# plus the networks listed here (e.g. "10.1.2.0/24,127.0.0.1/32"); keys from COLLAB_TOOL_KEY_*
# variables, plus those listed in COLLAB_TOOL_KEY_VARIABLES (a provider's key is not a tool's).
COLLAB_TOOL_ALLOWED_NETWORKS = [n.strip() for n in env("COLLAB_TOOL_ALLOWED_NETWORKS").split(",") if n.strip()]
for _network in COLLAB_TOOL_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"COLLAB_TOOL_ALLOWED_NETWORKS: {_network!r} is not a network (write e.g. 10.1.2.0/24 or 127.0.0.1/32)."
        ) from None
COLLAB_TOOL_KEY_VARIABLES = [n.strip() for n in env("COLLAB_TOOL_KEY_VARIABLES").split(",") if n.strip()]
# MCP servers (docs/architecture/agents.md, "MCP servers"): stdio servers run a command
# staff typed on this machine, so only where the operator allows it; the tools' lists are
# refreshed this often by `manage.py refresh_mcp_tools --every`, which `serve` starts.
COLLAB_MCP_STDIO = env_flag("COLLAB_MCP_STDIO", False)
COLLAB_MCP_REFRESH_S = env_float("COLLAB_MCP_REFRESH_S", 900.0)
# Uploads never posted are deleted after COLLAB["ORPHAN_UPLOAD_HOURS"] by
# `manage.py sweep_uploads --every`, which `serve` starts with this period (0: not started).
COLLAB_SWEEP_UPLOADS_S = env_float("COLLAB_SWEEP_UPLOADS_S", 3600.0)


def env_limit(name: str, kind: type[int] | type[Decimal]) -> Any:
    """A budget limit from the environment: a number of at least 0, or None when unset."""
    raw = env(name).strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except (ValueError, ArithmeticError):
        value = None
    if value is None or value < 0 or (isinstance(value, Decimal) and not value.is_finite()):
        raise ImproperlyConfigured(f"{name}={raw!r}: write a number of at least 0, or leave it unset (no limit).")
    return value


# The monthly budget of every room without one of its own (collab/chat/services/budgets.py):
# tokens (prompt and reply) and/or US dollars; unset: no default limit.
COLLAB_DEFAULT_ROOM_BUDGET_TOKENS: int | None = env_limit("COLLAB_DEFAULT_ROOM_BUDGET_TOKENS", int)
COLLAB_DEFAULT_ROOM_BUDGET_COST: Decimal | None = env_limit("COLLAB_DEFAULT_ROOM_BUDGET_COST", Decimal)

COLLAB: dict[str, Any] = {
    # One frame per room per window after the first piece: 30 ms keeps 33 frames/s per
    # reply, far below what the pub/sub layer can send (docs/benchmarks/2026-12-02.md#b-channel-layers).
    "COALESCE_MS": env_float("COLLAB_COALESCE_MS", 30.0),
    "MAX_MESSAGE_CHARS": env_int("COLLAB_MAX_MESSAGE_CHARS", 8000),
    # Markdown is rendered by this many worker processes, each killed at the budget (from
    # the ask, queueing included): a text that misses it is shown as written (chat/markup.py).
    "RENDER_BUDGET_S": env_float("COLLAB_RENDER_BUDGET_S", 2.0),
    "RENDER_WORKERS": env_int("COLLAB_RENDER_WORKERS", 2),
    # A frame from a browser is a form: text plus htmx headers; 4x the text cap is ample.
    "MAX_FRAME_BYTES": env_int("COLLAB_MAX_FRAME_BYTES", 64_000),
    "HISTORY_MESSAGES": 50,  # shown on open and per "older" page
    # Posting: a burst of 8, then one every 1.5 s, per member and room.
    "POST_BURST": env_int("COLLAB_POST_BURST", 8),
    "POST_REFILL_S": env_float("COLLAB_POST_REFILL_S", 1.5),
    # "NAME is typing": at most one broadcast per member and room per this many seconds.
    "TYPING_EVERY_S": env_float("COLLAB_TYPING_EVERY_S", 2.0),
    # Who came and went, told to a room at most once per this interval (services/presence.py).
    "PRESENCE_MS": env_float("COLLAB_PRESENCE_MS", 500.0),
    # Model context per assistant, in characters (~4 per token) of room history.
    "CONTEXT_CHARS": env_int("COLLAB_CONTEXT_CHARS", 12_000),
    "MAX_CONCURRENT_REPLIES_PER_MESSAGE": 8,
    # A socket that reads slower than its room streams: its frames wait in the app, up to
    # this many and this many bytes; past either it is closed with 4408 (collab/chat/outbox.py).
    "SOCKET_BACKLOG_FRAMES": env_int("COLLAB_SOCKET_BACKLOG_FRAMES", 2000),
    "SOCKET_BACKLOG_BYTES": env_int("COLLAB_SOCKET_BACKLOG_BYTES", 1 << 20),
    # Files (docs/wire.md, "Files"): caps per file and per message, a member's uploads (a
    # burst, then one per refill), images' pixels as stored, documents' extraction budget.
    "MAX_FILE_BYTES": env_int("COLLAB_MAX_FILE_BYTES", 20 << 20),
    "MAX_MESSAGE_FILES": env_int("COLLAB_MAX_MESSAGE_FILES", 10),
    "MAX_MESSAGE_FILE_BYTES": env_int("COLLAB_MAX_MESSAGE_FILE_BYTES", 50 << 20),
    "UPLOAD_BURST": env_int("COLLAB_UPLOAD_BURST", 20),
    "UPLOAD_REFILL_S": env_float("COLLAB_UPLOAD_REFILL_S", 3.0),
    "MAX_IMAGE_PIXELS": env_int("COLLAB_MAX_IMAGE_PIXELS", 50_000_000),  # larger is refused (a bomb)
    "IMAGE_MAX_SIDE": env_int("COLLAB_IMAGE_MAX_SIDE", 2048),  # stored no larger (re-encoded)
    "EXTRACT_BUDGET_S": env_float("COLLAB_EXTRACT_BUDGET_S", 20.0),
    "EXTRACT_MEMORY_MB": env_int("COLLAB_EXTRACT_MEMORY_MB", 512),
    "MAX_EXTRACTED_CHARS": env_int("COLLAB_MAX_EXTRACTED_CHARS", 2_000_000),
    "FILE_PART_CHARS": env_int("COLLAB_FILE_PART_CHARS", 2000),
    "ORPHAN_UPLOAD_HOURS": env_float("COLLAB_ORPHAN_UPLOAD_HOURS", 24.0),
    # Room sockets admitted per second by one process (a token bucket, burst the same); past
    # it the handshake is closed 4429 with a retry hint (collab/chat/admission.py). 0: no limit.
    "CONNECT_RATE": env_float("COLLAB_CONNECT_RATE", 600.0),
    # SIGTERM: how long running replies may finish before the rest are stored `interrupted`.
    "DRAIN_S": env_float("COLLAB_DRAIN_S", 10.0),
    # The process's background work: control listener, heartbeat, sweep (collab/chat/lifecycle.py).
    "BACKGROUND": env("COLLAB_BACKGROUND", "1") == "1",
}
