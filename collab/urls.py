from django.contrib import admin
from django.contrib.auth.decorators import login_not_required
from django.templatetags.static import static
from django.urls import path, re_path
from django.views.generic import RedirectView

from collab.chat import (
    file_signed_views,  # signed links to images, for model providers
    file_views,
    history_views,
    reaction_views,
    settings_views,
    thread_views,
    views,
)
from collab.signin import oidc
from collab.signin import views as signin_views

urlpatterns = [
    path("", views.rooms, name="rooms"),
    # PUT would be a POST to Django's FormView: only the methods a browser uses.
    path("accounts/login/", signin_views.login, name="login"),
    path("accounts/logout/", signin_views.logout, name="logout"),
    path("accounts/signup/", signin_views.signup, name="signup"),
    # OpenID Connect (collab/signin/oidc.py): the names allauth's provider reverses. Only
    # these of allauth's URLs: its own account pages (password reset by email, ...) are not collab's.
    path("accounts/oidc/<str:provider_id>/login/", oidc.login, name="openid_connect_login"),
    path("accounts/oidc/<str:provider_id>/login/callback/", oidc.callback, name="openid_connect_callback"),
    path("accounts/oidc/cancelled/", signin_views.provider_cancelled, name="socialaccount_login_cancelled"),
    path("accounts/oidc/conflict/", signin_views.provider_signup_conflict, name="socialaccount_signup"),
    path("r/<slug:slug>/", views.room, name="room"),
    path("r/<slug:slug>/older/", views.room_older, name="room_older"),
    path("r/<slug:slug>/m/<int:message_id>/", views.message_full, name="message_full"),
    path("r/<slug:slug>/t/<int:message_id>/", thread_views.thread, name="thread"),
    path("r/<slug:slug>/m/<int:message_id>/edit/", history_views.edit_form, name="message_edit"),
    path("r/<slug:slug>/files/", file_views.upload, name="file_upload"),
    path("r/<slug:slug>/f/<int:file_id>/thumb", file_views.thumb, name="file_thumb"),
    path("r/<slug:slug>/f/<int:file_id>/<str:name>", file_views.download, name="file"),
    path("files/s/<str:token>", file_signed_views.signed, name="file_signed"),  # no login: the token is the key
    path("r/<slug:slug>/search", history_views.search, name="room_search"),
    re_path(r"^r/(?P<slug>[-a-zA-Z0-9_]+)/export\.(?P<fmt>md|json)$", history_views.export, name="room_export"),
    path("r/<slug:slug>/leave/", views.leave, name="leave"),
    path("r/<slug:slug>/settings/", settings_views.room_settings, name="room_settings"),
    path("r/<slug:slug>/join/", views.join_as_staff, name="room_join"),
    path("join/<str:token>/", views.join, name="join"),
    path("healthz", views.healthz, name="healthz"),
    path("emoji.json", reaction_views.emoji_catalogue, name="emoji_catalogue"),
    # Browsers ask for it whatever a page links, logged in or not: the SVG the pages link
    # (templates/base.html).
    path(
        "favicon.ico",
        login_not_required(RedirectView.as_view(url=static("collab/favicon.svg"), permanent=True)),
        name="favicon",
    ),
    path("metrics", views.metrics_view, name="metrics"),
    path("docs/providers/", views.provider_docs, name="docs_providers"),
    # With COLLAB_PASSWORD_LOGIN=0 the admin's password form is closed too (signin/views.py).
    path("admin/login/", signin_views.admin_gate(admin.site.login), name="admin_login_gate"),
    path("admin/", admin.site.urls),
]
