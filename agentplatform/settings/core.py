"""Django's own settings: secret key, hosts, apps, middleware, templates, static files."""

from __future__ import annotations

from pathlib import Path

from agentplatform.settings.environment import BASE_DIR, VAR_DIR, env_value

# A well-known value that the production system check refuses.
DEFAULT_SECRET_KEY = "agentplatform-embedded-insecure-secret-key"  # noqa: S105
SECRET_KEY = env_value("SECRET_KEY", str, DEFAULT_SECRET_KEY)
DEBUG = env_value("DEBUG", bool, False)
ALLOWED_HOSTS = env_value("ALLOWED_HOSTS", list, ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env_value("CSRF_TRUSTED_ORIGINS", list, [])

INSTALLED_APPS = [
    "agentplatform.console.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_results",
    "django_celery_beat",
    "runs",
    "jobs",
    "webhooks",
]

MIDDLEWARE = [
    # First: every later line of the request carries its request id and trace.
    "agentplatform.middleware.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files straight from the web process in every mode (uvicorn serves none).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "agentplatform.api.limits.ApiBodyLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "agentplatform.urls"
WSGI_APPLICATION = "agentplatform.wsgi.application"
ASGI_APPLICATION = "agentplatform.asgi.application"

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

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# The console's own script (static/console/live.js), plain files: no build step.
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_value("STATIC_ROOT", str, str(VAR_DIR / "static")))
# Hashed, compressed copies made by ``collectstatic`` (``make setup``/``migrate`` run it),
# served far-future cached by WhiteNoise.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
