"""One redaction of user and password for the URIs a catalog is given: SQLAlchemy URLs (whose
password may hold ``/ ? # @ :`` unencoded), JDBC URLs (credentials as parameters, or
``user/password@`` for Oracle) and REST/HTTP URIs. Whatever the characters, a password never
survives :func:`redact_uri`, :func:`uri_location` or :func:`redact_text`."""

from __future__ import annotations

import pytest

from airflow_provider_kappa.redact import redact_text, redact_uri, uri_location, uri_secrets

#: each character SQLAlchemy takes unencoded in a password, alone and all together
PASSWORDS = ["pa/ss", "pa?ss", "pa#ss", "pa@ss", "pa:ss", "p/?#@:w"]


@pytest.mark.parametrize("password", PASSWORDS)
def test_sqlalchemy_url(password: str) -> None:
    uri = f"postgresql+psycopg2://kappa:{password}@db.internal:5432/catalog?sslmode=require"
    assert redact_uri(uri) == "postgresql+psycopg2://***:***@db.internal:5432/catalog?sslmode=require"
    assert uri_location(uri) == "postgresql+psycopg2://db.internal:5432/catalog"
    assert password in uri_secrets(uri)
    text = redact_text(f"OperationalError: cannot connect to {uri} (password {password!r})", {"uri": uri})
    assert password not in text and "kappa" not in text
    assert "postgresql+psycopg2://***:***@db.internal:5432/catalog" in text


@pytest.mark.parametrize("password", PASSWORDS)
def test_jdbc_url_with_parameters(password: str) -> None:
    uri = f"jdbc:postgresql://db.internal:5432/catalog?user=kappa&password={password}&ssl=true"
    assert redact_uri(uri) == "jdbc:postgresql://db.internal:5432/catalog?user=***&password=***&ssl=true"
    assert uri_location(uri) == "jdbc:postgresql://db.internal:5432/catalog"
    last = f"jdbc:postgresql://db.internal:5432/catalog?user=kappa&password={password}"  # the password last
    sqlserver = f"jdbc:sqlserver://db.internal:1433;databaseName=cat;user=kappa;password={password}"
    oracle = f"jdbc:oracle:thin:kappa/{password}@//db.internal:1521/svc"
    for other in (last, sqlserver, oracle):
        for shown in (redact_uri(other), uri_location(other), redact_text(f"failed: {other}", {"uri": other})):
            assert password not in shown and "kappa" not in shown, shown
    assert uri_location(sqlserver) == "jdbc:sqlserver://db.internal:1433"
    assert redact_uri(oracle) == "jdbc:oracle:thin:***/***@//db.internal:1521/svc"
    assert uri_location(oracle) == "jdbc:oracle:thin:@//db.internal:1521/svc"


@pytest.mark.parametrize("password", PASSWORDS)
def test_rest_uri(password: str) -> None:
    uri = f"https://kappa:{password}@rest.example:8181/api/catalog"
    assert redact_uri(uri) == "https://***:***@rest.example:8181/api/catalog"
    assert uri_location(uri) == "https://rest.example:8181/api/catalog"
    assert password in uri_secrets(uri)
    token = f"https://rest.example/api/catalog?token={password}&x=1"
    assert redact_uri(token) == "https://rest.example/api/catalog?token=***&x=1"


def test_uris_without_credentials_are_kept() -> None:
    for uri in ("sqlite:////var/kappa/catalog.db", "s3://bucket/wh", "https://rest.example/a@b", "/var/kappa/wh"):
        assert redact_uri(uri) == uri and not uri_secrets(uri)
    assert redact_uri("https://token@rest.example/api") == "https://***@rest.example/api"
    assert uri_location("https://token@rest.example/api?x=1#f") == "https://rest.example/api"
    assert uri_location("/var/kappa/wh") == "/var/kappa/wh"


def test_text_redaction_masks_secret_properties_and_every_uri_password() -> None:
    props = {
        "uri": "postgresql://kappa:p%40ss@db:5432/cat",
        "credential": "client:s3cr3t",
        "s3.secret-access-key": "AKIASECRET",
        "warehouse": "s3://bucket/w",
    }
    text = "failed: postgresql://kappa:p%40ss@db:5432/cat (p@ss) with client:s3cr3t and AKIASECRET in s3://bucket/w"
    assert (
        redact_text(text, props) == "failed: postgresql://***:***@db:5432/cat (***) with *** and *** in s3://bucket/w"
    )
