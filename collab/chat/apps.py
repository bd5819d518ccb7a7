from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "collab.chat"
    label = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from collab.chat import early
        from collab.chat.actions import sessions  # noqa: F401 (connects its signal receiver)

        early.connect_signals()  # a room's settings, an assistant, a provider: guesses forgotten
