"""Signing in: collab's password form and OpenID Connect providers (docs/architecture/sign-in.md)."""
