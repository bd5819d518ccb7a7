"""The test suite's environment, set before pytest-django loads the settings (a plugin:
`-p tests.environment` in pyproject.toml; conftest.py would come too late).

The settings refuse to load without DJANGO_SECRET_KEY (collab/settings.py), and the suite
speaks plain http on loopback (COLLAB_HTTPS=0). Set in os.environ, both reach every
process a test starts (Daphne, manage.py, the load test) as well.
"""

from __future__ import annotations

import os
import secrets

# One key per run (with at least 50 characters and no "django-insecure-" mark, as
# `check --deploy` wants), unless the caller gave one.
os.environ.setdefault("DJANGO_SECRET_KEY", "tests-" + secrets.token_urlsafe(50))
os.environ.setdefault("COLLAB_HTTPS", "0")

# Members' files (collab/chat/file_models.py) go to a folder of this run, never the
# checkout's media/; every process a test starts stores in the same one.
if "COLLAB_MEDIA_ROOT" not in os.environ:
    import tempfile

    os.environ["COLLAB_MEDIA_ROOT"] = tempfile.mkdtemp(prefix="collab-media-")
