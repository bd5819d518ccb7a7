#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "collab.settings")
    from collab.deploy import use_local_secret_key

    # The local tool: without DJANGO_SECRET_KEY, the key kept in .cache/secret_key (made
    # once). A server started on collab.asgi refuses to start without it instead.
    use_local_secret_key()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
