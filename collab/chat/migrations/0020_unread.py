# Unread per member (read up to seq N) and the member's notification setting per room.

from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def read_up_to_now(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Memberships that existed before unread was kept: everything so far counts as read."""
    Membership = apps.get_model("chat", "Membership")
    Room = apps.get_model("chat", "Room")
    Membership.objects.update(read_seq=Subquery(Room.objects.filter(pk=OuterRef("room_id")).values("last_seq")[:1]))


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0019_mcp_servers"),
    ]

    operations = [
        migrations.AddField(
            model_name="membership",
            name="read_seq",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="membership",
            name="notify",
            field=models.CharField(
                choices=[
                    ("all", "every message"),
                    ("mentions", "mentions and replies to me"),
                    ("none", "never (unread still counted)"),
                ],
                default="mentions",
                max_length=10,
            ),
        ),
        migrations.RunPython(read_up_to_now, migrations.RunPython.noop),
    ]
