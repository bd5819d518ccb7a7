from django.urls import path

from collab.chat.consumers import RoomConsumer

websocket_urlpatterns = [
    path("ws/rooms/<slug:slug>/", RoomConsumer.as_asgi()),
]
