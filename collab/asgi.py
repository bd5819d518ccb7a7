"""ASGI entry point: HTTP through Django, WebSockets through Channels.

WebSockets pass an origin check (collab/origins.py: this site whole, scheme, host and
port, or one of CSRF_TRUSTED_ORIGINS) and carry their session to the consumer, which
authenticates it (collab/chat/socket_auth.py).
HTTP requests past the largest upload are refused before their body is read (collab/bodycap.py).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "collab.settings")

from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.sessions import SessionMiddlewareStack  # noqa: E402

from collab.bodycap import BodyCap  # noqa: E402
from collab.chat.startup import start_with_server  # noqa: E402
from collab.origins import OriginValidator  # noqa: E402
from collab.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodyCap(django_asgi_app),  # no body past the largest upload is read
        # The session only: the consumer reads the user with their membership (collab/chat/socket_auth.py).
        "websocket": OriginValidator(SessionMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
start_with_server()  # heartbeat, sweep, control listener, SIGTERM drain (collab/chat/startup.py, lifecycle.py)
