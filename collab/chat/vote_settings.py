"""The room's voting settings (the owner, on the room's settings page; docs/wire.md,
"vote"): who may vote, the approval rule, whether rejected replies are left out of the
history sent to assistants. A change applies from the next vote (and, for history,
from the next reply): verdicts already counted stand until a vote on that reply."""

from __future__ import annotations

from django import forms
from django.contrib import messages as flash
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from collab.chat import replies
from collab.chat.models import Room


class VoteSettingsForm(forms.ModelForm):
    class Meta:
        model = Room
        fields = ["voters", "approval", "rejected_left_out"]
        widgets = {"voters": forms.RadioSelect, "approval": forms.RadioSelect}


def form_for(room: Room, data: object = None) -> VoteSettingsForm:
    return VoteSettingsForm(data, instance=room, prefix="votes")  # type: ignore[arg-type]


def post(request: HttpRequest, room: Room) -> HttpResponse | VoteSettingsForm:
    """Save the owner's voting settings: a redirect, or the form with its errors."""
    form = form_for(room, request.POST)
    if not form.is_valid():
        return form
    Room.objects.filter(pk=room.pk).update(**{name: form.cleaned_data[name] for name in VoteSettingsForm.Meta.fields})
    replies.context_changed(room.pk)  # the history a reply is sent (rejected_left_out): no guess from before
    flash.success(request, "Voting settings saved.")
    return redirect("room_settings", slug=room.slug)
