"""ASGI entry point: HTTP through Django, WebSockets through Channels.

WebSockets pass an origin check (hosts from ALLOWED_HOSTS, never "*": a wildcard would
switch the check off) and session authentication before reaching a consumer.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "collab.settings")

from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import OriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from collab.chat.lifecycle import start_with_server  # noqa: E402
from collab.routing import websocket_urlpatterns  # noqa: E402

allowed_origins = [h for h in settings.ALLOWED_HOSTS if h != "*"]

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": OriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)), allowed_origins),
    }
)
start_with_server()  # heartbeat, sweep, control listener, SIGTERM drain (collab/chat/lifecycle.py)
