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

# Members' files (collab/chat/file_models.py) go to a folder of this test process, never
# the checkout's media/: one per pytest-xdist worker (tests count the files stored), and
# every process a test starts (Daphne, the load test) stores in its test process's one.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if os.environ.get("COLLAB_TEST_MEDIA_OF") != _worker or "COLLAB_MEDIA_ROOT" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["COLLAB_MEDIA_ROOT"] = _media = tempfile.mkdtemp(prefix=f"collab-media-{_worker or 'main'}-")
    os.environ["COLLAB_TEST_MEDIA_OF"] = _worker
    atexit.register(shutil.rmtree, _media, ignore_errors=True)
