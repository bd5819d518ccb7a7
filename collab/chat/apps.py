from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "collab.chat"
    label = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Not at import: these modules read the models, which exist once the apps are loaded.
        from collab.chat import commands, lifecycle, replies  # noqa: F401 (commands: fills the registry)
        from collab.chat.services import sessions  # noqa: F401 (connects its signal receiver)

        replies.install()  # a room's settings, an assistant, a provider, a room frame: guesses kept current
