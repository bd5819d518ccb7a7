"""Of allauth's admin pages, staff keep only the linked accounts (who signed in through which
provider, by subject; deleting one unlinks it). Providers are configured by environment,
never as SocialApp rows that would hold a secret, tokens are not stored, and email
addresses are the User's own (docs/architecture/sign-in.md)."""

from allauth.account.models import EmailAddress
from allauth.socialaccount.models import SocialApp, SocialToken
from django.contrib import admin

for model in (SocialApp, SocialToken, EmailAddress):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
