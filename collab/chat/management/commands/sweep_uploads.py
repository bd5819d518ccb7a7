"""`manage.py sweep_uploads [--every SECONDS]`: delete the uploads never posted, older
than COLLAB["ORPHAN_UPLOAD_HOURS"] (docs/architecture/files.md, "Clean-up").

A member who uploads and never sends leaves a file no one can see but them; after the
grace it goes. Its row is deleted, and the row's receiver (collab/chat/file_models.py)
deletes the stored bytes once the deletion commits. Once, or with `--every` again and
again until stopped: `serve` starts it so (COLLAB_SWEEP_UPLOADS_S); a cron job or a
systemd timer may run it once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from collab.chat.file_models import Attachment
from collab.chat.management import schedule

BATCH = 500


def sweep(hours: float | None = None) -> int:
    """Delete the orphaned uploads; how many were."""
    grace = settings.COLLAB["ORPHAN_UPLOAD_HOURS"] if hours is None else hours
    cutoff = timezone.now() - timedelta(hours=float(grace))
    done = 0
    while True:
        ids = list(
            Attachment.objects.filter(message__isnull=True, created_at__lt=cutoff).values_list("pk", flat=True)[:BATCH]
        )
        if not ids:
            return done
        with transaction.atomic():
            # The filter again: one posted since the list was read stays.
            deleted = (
                Attachment.objects.filter(pk__in=ids, message__isnull=True).delete()[1].get(Attachment._meta.label, 0)
            )
        done += deleted
        if len(ids) < BATCH:
            return done


class Command(BaseCommand):
    help = "Delete uploads never posted, older than COLLAB_ORPHAN_UPLOAD_HOURS (once, or --every SECONDS)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every",
            type=float,
            default=0.0,
            help=f"repeat every SECONDS (serve: {settings.COLLAB_SWEEP_UPLOADS_S:g})",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        once = opts["every"] == 0

        def job() -> None:
            count = sweep()
            if count or once:
                self.stdout.write(f"{count} upload(s) never posted deleted")

        schedule.every(opts["every"], job)
