"""A real OpenID Connect provider for the tests, run as a process of its own on loopback
(`python -m tests.oidc_provider --client-id ID --client-secret-env NAME`): discovery, JWKS,
authorize (a sign-in form), token (authorization code with PKCE S256, client secret by
POST or Basic), userinfo and end-session endpoints. ID tokens are RS256 JWTs signed with
joserfc (authlib's JOSE library).

It prints "listening http://127.0.0.1:PORT" once it accepts connections; tests/oidc.py
waits for that line. Test controls, never part of a real provider:

- POST /_control with JSON merged into the controls: `user` (the claims of whoever signs
  in: sub, email, email_verified, groups, ...), `audience` (the ID token's aud instead of
  the client id), `expired_s` (exp that many seconds ago), `bad_signature` (signed with
  another key under the published kid), `nonce` (instead of the one asked for),
  `end_session` (false: discovery offers no end_session_endpoint);
- GET /_control/log: what it saw (authorize, token, userinfo and logout requests).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import json
import os
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from joserfc import jwt
from joserfc.jwk import RSAKey

KID = "test-key-1"
DEFAULT_USER = {
    "sub": "u-alice",
    "email": "alice@example.com",
    "email_verified": True,
    "preferred_username": "alice",
    "name": "Alice Example",
    "groups": ["collab-users"],
}


class Provider:
    def __init__(self, client_id: str, client_secret: str) -> None:
        self.client_id, self.client_secret = client_id, client_secret
        params = {"kid": KID, "use": "sig", "alg": "RS256"}
        self.key = RSAKey.generate_key(2048, parameters=params)
        self.other_key = RSAKey.generate_key(2048, parameters=params)  # for bad signatures
        self.issuer = ""
        self.lock = threading.Lock()
        self.controls: dict[str, Any] = {"user": dict(DEFAULT_USER), "end_session": True}
        self.pending: dict[str, dict[str, Any]] = {}  # authorize requests waiting for the form
        self.codes: dict[str, dict[str, Any]] = {}  # issued codes, each used once
        self.tokens: dict[str, dict[str, Any]] = {}  # access token -> userinfo claims
        self.log: list[dict[str, Any]] = []

    def discovery(self) -> dict[str, Any]:
        doc = {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_post", "client_secret_basic"],
            "scopes_supported": ["openid", "profile", "email", "groups"],
        }
        if self.controls.get("end_session", True):
            doc["end_session_endpoint"] = f"{self.issuer}/logout"
        return doc

    def id_token(self, user: dict[str, Any], nonce: str) -> str:
        c = self.controls
        now = int(time.time())
        exp = now - int(c["expired_s"]) if c.get("expired_s") else now + 300
        claims = {
            **user,
            "iss": self.issuer,
            "aud": c.get("audience") or self.client_id,
            "iat": min(now, exp - 60),
            "exp": exp,
            "auth_time": now,
            "nonce": c.get("nonce") or nonce,
        }
        key = self.other_key if c.get("bad_signature") else self.key
        return jwt.encode({"alg": "RS256", "kid": KID, "typ": "JWT"}, claims, key)


class Handler(BaseHTTPRequestHandler):
    provider: Provider  # set on the subclass made in main()

    def log_message(self, format: str, *args: Any) -> None:
        return None  # the tests read /_control/log instead

    def send(self, status: int, body: str | dict[str, Any], kind: str = "application/json", **headers: str) -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(data)

    def redirect(self, url: str) -> None:
        self.send(302, "", "text/plain", Location=url)

    def form(self) -> dict[str, str]:
        length = int(self.headers.get("Content-Length") or 0)
        return {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}

    def do_GET(self) -> None:
        p = self.provider
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with p.lock:
            if url.path == "/.well-known/openid-configuration":
                return self.send(200, p.discovery())
            if url.path == "/jwks":
                return self.send(200, {"keys": [p.key.as_dict(private=False)]})
            if url.path == "/authorize":
                return self.authorize(query)
            if url.path == "/userinfo":
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                p.log.append({"event": "userinfo", "known": token in p.tokens})
                if token not in p.tokens:
                    return self.send(401, {"error": "invalid_token"})
                return self.send(200, p.tokens[token])
            if url.path == "/logout":
                p.log.append({"event": "logout", **query})
                if query.get("post_logout_redirect_uri"):
                    return self.redirect(query["post_logout_redirect_uri"])
                return self.send(200, "<p>Signed out of the test provider.</p>", "text/html")
            if url.path == "/_control/log":
                return self.send(200, {"log": p.log})
        self.send(404, {"error": "not_found"})

    def authorize(self, q: dict[str, str]) -> None:
        p = self.provider
        p.log.append({"event": "authorize", **q})
        problems = [
            q.get("client_id") != p.client_id and "unknown client_id",
            q.get("response_type") != "code" and "response_type must be code",
            "openid" not in q.get("scope", "").split() and "scope must include openid",
            not q.get("redirect_uri") and "redirect_uri missing",
            not q.get("state") and "state missing",
            not q.get("nonce") and "nonce missing",
            (q.get("code_challenge_method") != "S256" or not q.get("code_challenge")) and "PKCE S256 required",
        ]
        if any(problems):
            return self.send(400, {"error": "invalid_request", "error_description": "; ".join(filter(None, problems))})
        request_id = secrets.token_urlsafe(16)
        p.pending[request_id] = q
        user = html.escape(str(p.controls["user"].get("preferred_username", "")))
        page = (
            "<!doctype html><title>Test provider</title><h1>Test provider</h1>"
            f'<form method="post" action="/authorize"><input type="hidden" name="request_id" value="{request_id}">'
            f'<button type="submit" id="approve">Sign in as {user}</button></form>'
        )
        self.send(200, page, "text/html; charset=utf-8")

    def do_POST(self) -> None:
        p = self.provider
        path = urlsplit(self.path).path
        with p.lock:
            if path == "/_control":
                length = int(self.headers.get("Content-Length") or 0)
                p.controls.update(json.loads(self.rfile.read(length) or b"{}"))
                return self.send(200, {"controls": p.controls})
            if path == "/authorize":
                q = p.pending.pop(self.form().get("request_id", ""), None)
                if q is None:
                    return self.send(400, {"error": "invalid_request", "error_description": "unknown request"})
                code = secrets.token_urlsafe(24)
                p.codes[code] = {**q, "user": dict(p.controls["user"])}
                return self.redirect(f"{q['redirect_uri']}?{urlencode({'code': code, 'state': q['state']})}")
            if path == "/token":
                return self.token(self.form())
        self.send(404, {"error": "not_found"})

    def token(self, f: dict[str, str]) -> None:
        p = self.provider
        client_id, secret = f.get("client_id"), f.get("client_secret")
        basic = self.headers.get("Authorization", "")
        if basic.startswith("Basic "):
            client_id, _, secret = base64.b64decode(basic[6:]).decode().partition(":")
        grant = p.codes.pop(f.get("code", ""), None)
        verifier = f.get("code_verifier", "")
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        p.log.append({"event": "token", "pkce_ok": bool(grant) and challenge == grant["code_challenge"]})
        if client_id != p.client_id or not secrets.compare_digest(secret or "", p.client_secret):
            return self.send(401, {"error": "invalid_client"})
        if grant is None or f.get("grant_type") != "authorization_code":
            return self.send(400, {"error": "invalid_grant", "error_description": "unknown or used code"})
        if f.get("redirect_uri") != grant["redirect_uri"] or challenge != grant["code_challenge"]:
            return self.send(400, {"error": "invalid_grant", "error_description": "redirect_uri or PKCE mismatch"})
        access = secrets.token_urlsafe(24)
        p.tokens[access] = grant["user"]
        id_token = p.id_token(grant["user"], grant["nonce"])
        self.send(200, {"access_token": access, "token_type": "Bearer", "expires_in": 300, "id_token": id_token})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--client-secret-env", required=True, help="the variable holding the client secret")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    provider = Provider(args.client_id, os.environ[args.client_secret_env])
    server = ThreadingHTTPServer(("127.0.0.1", args.port), type("H", (Handler,), {"provider": provider}))
    provider.issuer = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"listening {provider.issuer}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
