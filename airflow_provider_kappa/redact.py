"""The one redaction of credentials: in a catalog's URI, and in text (an error message) quoting one.

Three kinds of URI carry a user and a password, each read as its own client reads it:

- SQLAlchemy URLs, ``postgresql+psycopg2://user:password@host:5432/db?sslmode=require``: SQLAlchemy
  takes ``/ ? # @ :`` unencoded in the password, which :func:`urllib.parse.urlsplit` cuts elsewhere
  (the password's end becomes a path, a query or a fragment). Here the password runs to the last
  ``@`` followed by a host (``[v6]`` or a name), an optional ``:port``, then ``/ ? # ; :`` or the end;
- JDBC URLs: credentials as parameters (``jdbc:postgresql://host/db?user=u&password=p``,
  ``jdbc:sqlserver://host:1433;user=u;password=p``), or ``user/password@`` after an Oracle driver
  (``jdbc:oracle:thin:u/p@//host:1521/svc``);
- REST/HTTP URIs, ``https://user:password@host/path``, and secret parameters (``?token=...``).

An ambiguous URI (``@`` both in a password and later in a path) is masked up to the later ``@``:
its host may be lost from :func:`uri_location`, never a password shown. Imports nothing of the package.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote

MASK = "***"

#: Property-name fragments whose values are secrets (pyiceberg's credential, token, keys, passwords).
SECRET_KEY_PARTS = ("password", "secret", "token", "credential", "session", "private", "access-key", "key-id")

#: A URI parameter naming the user (its value is masked in :func:`redact_uri`, not searched for in text).
USER_PARAMS = frozenset({"user", "username", "userid", "user id", "uid", "login"})

#: Fragments of a URI parameter's name whose value is a secret (``password``, ``sslpassword``, ``pwd``...).
SECRET_PARAM_PARTS = ("password", "passwd", "pwd", "secret", "token", "credential", "apikey", "api_key", "api-key")
SECRET_PARAM_PARTS += ("signature", "private")

_HOST_AND_REST = r"(?:\[[0-9A-Fa-f:.%\w]+\]|[\w.~%!$'()*+,-]+)(?::\d*)?(?:[/?#;:].*)?"

#: ``scheme[:subscheme]://user[:password]@host...``; the password greedy, to the last ``@`` before a host.
_AUTHORITY = re.compile(
    r"(?P<head>[A-Za-z][\w+.\-]*:(?:[A-Za-z][\w+.\-]*:)*//)(?P<user>[^:/?#]*)(?::(?P<password>.*))?@"
    rf"(?P<rest>{_HOST_AND_REST})",
    re.S,
)

#: ``jdbc:oracle:<driver>:user/password@[//]host...``.
_ORACLE = re.compile(
    rf"(?P<head>jdbc:oracle:\w+:)(?P<user>[^/@]*)(?:/(?P<password>.*))?(?P<rest>@(?://)?{_HOST_AND_REST})",
    re.S | re.I,
)

#: A ``?name=value`` / ``&name=value`` / ``;name=value`` parameter; its value runs to ``&``, ``;`` or the end.
_PARAM = re.compile(r"[?&;](?P<name>[\w.\- ]+?)=(?P<value>[^&;]*)")


def _params(uri: str) -> list[tuple[int, int, bool]]:
    """``(start, end, secret)`` of each user or secret parameter's value in ``uri``."""
    spans = []
    for param in _PARAM.finditer(uri):
        name = param.group("name").lower()
        secret = any(part in name for part in SECRET_PARAM_PARTS)
        if param.group("value") and (secret or name in USER_PARAMS):
            spans.append((param.start("value"), param.end("value"), secret))
    return spans


def _userinfo(uri: str) -> re.Match[str] | None:
    """The match of ``uri``'s user and password (groups ``head``, ``user``, ``password``, ``rest``);
    ``None`` also when the would-be password holds a credential parameter (``...?password=p@x``:
    the ``@`` is that parameter's)."""
    match = _AUTHORITY.fullmatch(uri) or _ORACLE.fullmatch(uri)
    if match is None or match.group("password") is None:
        return match
    inside = range(match.start("password"), match.end("password"))
    return None if any(start in inside for start, _, _ in _params(uri)) else match


def _spans(uri: str) -> list[tuple[int, int, bool]]:
    """``(start, end, secret)`` of each credential in ``uri``: the user (not secret: a name, masked
    but not searched for in text), the password and secret parameters (secret)."""
    spans = _params(uri)
    match = _userinfo(uri)
    if match is not None:
        for group, secret in (("user", False), ("password", True)):
            if match.group(group):
                spans.append((match.start(group), match.end(group), secret))
    return spans


def redact_uri(uri: str) -> str:
    """``uri`` with its user, password and secret parameters replaced by ``***``, all else kept:
    ``postgresql://***:***@db:5432/cat?sslmode=require``, ``jdbc:postgresql://db/cat?user=***&password=***``.

    :param uri: a URI (SQLAlchemy, JDBC, REST/HTTP, object store) or a local path.
    """
    out, at = [], 0
    for start, end, _ in sorted(_spans(uri)):
        if end <= at:
            continue
        out.append(uri[at:start] + MASK if start >= at else "")
        at = end
    return "".join(out) + uri[at:]


def uri_secrets(uri: str) -> set[str]:
    """The passwords and secret parameter values in ``uri``, as written and percent-decoded.

    :param uri: a URI, as :func:`redact_uri` reads it.
    """
    found = {uri[start:end] for start, end, secret in _spans(uri) if secret}
    return {s for value in found for s in (value, unquote(value)) if s}


def without_userinfo(uri: str) -> str:
    """``uri`` with its ``user:password@`` removed (an Oracle URL keeps its ``@``), all else kept.

    :param uri: a URI without masked parts (:func:`uri_location` masks first).
    """
    match = _userinfo(uri)
    return uri if match is None else match.group("head") + match.group("rest")


def uri_location(uri: str) -> str:
    """Where ``uri`` points, without credentials, query or fragment (a catalog's namespace in an
    OpenLineage event): ``postgresql+psycopg2://db:5432/cat``, ``https://rest.example/api``; a JDBC
    or Spark Connect URL also loses its ``;name=value`` parameters.

    :param uri: a URI (SQLAlchemy, JDBC, REST/HTTP, object store) or a local path.
    """
    located = without_userinfo(redact_uri(uri))
    scheme = located.partition(":")[0].lower() if "://" in located else ""
    cut = "?#;" if scheme in ("jdbc", "sc") else "?#"
    for char in cut:
        located = located.split(char, 1)[0]
    return located


def redact_text(text: str, properties: Mapping[str, str]) -> str:
    """``text`` with every secret of ``properties`` replaced by ``***``: each URI-valued property
    quoted whole is replaced by its :func:`redact_uri`; then the values of secret-named properties
    and every password or secret parameter of a URI-valued one (as written and percent-decoded).

    :param text: an error message that may quote catalog properties.
    :param properties: the catalog's properties.
    """
    secrets, uris = set(), set()
    for key, value in properties.items():
        if not value:
            continue
        if any(part in key.lower() for part in SECRET_KEY_PARTS):
            secrets.add(value)
        if "://" in value or value.lower().startswith("jdbc:"):
            uris.add(value)
            secrets.update(uri_secrets(value))
    for uri in sorted(uris, key=len, reverse=True):
        text = text.replace(uri, redact_uri(uri))
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
