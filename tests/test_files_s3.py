"""Files in an S3-compatible store (docs/architecture/files.md, "Storage"): moto's server
on a loopback port stands in for the store; django-storages' S3 backend as
COLLAB_S3_BUCKET configures it. An upload becomes a private object, a member's download
is a redirect to a short-lived presigned URL that serves it with our type and
disposition, a non-member gets 404, and a deleted file's objects are gone."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from collab.chat.file_models import Attachment, AttachmentPart
from collab.chat.files import uploads
from collab.chat.models import Room
from collab.chat.services import rooms
from tests import file_samples as samples
from tests.servers import free_port, wait_http

pytestmark = pytest.mark.django_db

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server (installed with the dev extras), on a free loopback port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/moto-api/", proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def bucket(s3_endpoint: str, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh bucket, and the default storage pointed at it as collab/settings.py does
    for COLLAB_S3_BUCKET (the credentials from the environment, as in a deployment)."""
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    name = f"collab-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", **_lower(CREDENTIALS))
    client.create_bucket(Bucket=name)
    settings.COLLAB_S3_BUCKET = name
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": name,
                "endpoint_url": s3_endpoint,
                "region_name": "us-east-1",
                "default_acl": "private",
                "querystring_auth": True,
                "file_overwrite": False,
            },
        },
    }
    client.collab_bucket = name  # type: ignore[attr-defined]
    return client


def _lower(credentials: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": credentials["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": credentials["AWS_SECRET_ACCESS_KEY"],
    }


def keys(client: Any) -> set[str]:
    listed = client.list_objects_v2(Bucket=client.collab_bucket)
    return {o["Key"] for o in listed.get("Contents", [])}


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice")


@pytest.fixture
def room(alice: User) -> Room:
    return rooms.create_room(alice, "Bucket")


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_upload_is_a_private_object_served_to_members_by_a_presigned_url(
    bucket: Any, room: Room, alice: User
) -> None:
    client = client_of(alice)
    response = client.post(f"/r/{room.slug}/files/", {"file": SimpleUploadedFile("café.png", samples.png_with_text())})
    assert response.status_code == 201, response.content
    body = response.json()
    found = Attachment.objects.get(pk=body["id"])
    assert keys(bucket) == {found.file.name, found.thumb.name}
    assert found.file.name.startswith(f"files/{room.pk}/") and "café" not in found.file.name
    grants = bucket.get_object_acl(Bucket=bucket.collab_bucket, Key=found.file.name)["Grants"]
    assert [g["Permission"] for g in grants] == ["FULL_CONTROL"]  # the owner's alone: private

    redirect = client.get(body["url"])
    assert redirect.status_code == 302 and "private" in redirect["Cache-Control"]
    location = redirect["Location"]
    assert location.startswith(bucket.meta.endpoint_url) and "Signature" in location and "Expires=" in location
    with urllib.request.urlopen(location, timeout=10) as served:
        data = served.read()
        assert served.headers["Content-Type"] == "image/png"
        assert served.headers["Content-Disposition"] == "inline; filename*=utf-8''caf%C3%A9.png"
    stored = bucket.get_object(Bucket=bucket.collab_bucket, Key=found.file.name)["Body"].read()
    assert data == stored
    # Unsigned, the object is not served.
    unsigned = location.split("?", 1)[0]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(unsigned, timeout=10)
    assert refused.value.code == 403

    thumb = client.get(body["thumb_url"])
    assert thumb.status_code == 302
    with urllib.request.urlopen(thumb["Location"], timeout=10) as served:
        assert served.headers["Content-Type"] == "image/webp" and served.read(12)[8:12] == b"WEBP"

    stranger = client_of(User.objects.create_user("mallory"))
    for url in (body["url"], body["thumb_url"]):
        answer = stranger.get(url)
        assert answer.status_code == 404 and "Location" not in answer


def test_a_document_in_the_bucket_has_its_text_and_parts(bucket: Any, room: Room, alice: User) -> None:
    response = client_of(alice).post(
        f"/r/{room.slug}/files/", {"file": SimpleUploadedFile("spec.pdf", samples.pdf(["in the bucket"]))}
    )
    assert response.status_code == 201
    found = Attachment.objects.get(pk=response.json()["id"])
    assert found.text == "in the bucket" and AttachmentPart.objects.filter(attachment=found).count() == 1
    assert keys(bucket) == {found.file.name}


def test_deleting_a_file_removes_its_objects(
    django_capture_on_commit_callbacks: Any, bucket: Any, room: Room, alice: User
) -> None:
    client = client_of(alice)
    ids = [
        client.post(f"/r/{room.slug}/files/", {"file": SimpleUploadedFile("a.png", samples.png_with_text())}).json()[
            "id"
        ]
        for _ in range(2)
    ]
    first, second = Attachment.objects.in_bulk(ids).values()
    with django_capture_on_commit_callbacks(execute=True):
        first.delete()
    assert keys(bucket) == {second.file.name, second.thumb.name}
    with django_capture_on_commit_callbacks(execute=True):
        room.delete()
    assert keys(bucket) == set()


def test_a_failed_store_leaves_no_object(monkeypatch: pytest.MonkeyPatch, bucket: Any, room: Room, alice: User) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(Attachment, "save", fail)
    with pytest.raises(RuntimeError):
        uploads.intake(room, alice, SimpleUploadedFile("a.png", samples.png_with_text()))
    assert keys(bucket) == set() and not Attachment.objects.exists()
