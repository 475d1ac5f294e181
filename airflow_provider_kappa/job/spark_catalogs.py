"""A catalog of kappa.yaml given the way Spark users already configure it: ``spark.sql.catalog.<name>.*``.

A ``catalogs:`` entry takes one of two Spark forms besides pyiceberg properties and ``{conn_id}``:

- ``{spark_conf: {spark.sql.catalog.<name>: org.apache.iceberg.spark.SparkCatalog, spark.sql.catalog.<name>.type:
  rest, ...}}``: the keys as they are in spark-defaults.conf, an EMR classification or a Databricks cluster's
  Spark config, pasted unchanged;
- ``{spark_catalog: <name>}``: the Spark catalog ``<name>`` that ``job.spark_conf`` defines (the job's own Spark
  then has it too, for a ``spark.table("<name>.ns.table")`` lookup), written once.

:func:`spark_catalog_properties` translates either, when kappa.yaml is loaded, into the pyiceberg properties
the rest of kappa uses (the table in docs/catalogs.md): type ``rest``, ``hive``, ``glue`` and ``jdbc`` (a
SqlCatalog with a SQLAlchemy URI), by ``type`` or ``catalog-impl``. Anything pyiceberg has no counterpart for
(type ``hadoop``, an unknown key) is refused, naming the key, the value and what is allowed: bad input never
half-works. Secret values are never quoted; a URI in a message is masked by
:func:`~airflow_provider_kappa.redact.redact_uri`. Pure Python: safe at DAG-parse time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.redact import redact_uri

#: The keys of a ``catalogs:`` entry given as Spark conf (one of them, alone).
FORMS = ("spark_conf", "spark_catalog")
PREFIX = "spark.sql.catalog."
#: ``spark.sql.catalog.<name>``: Iceberg's Spark catalogs.
SPARK_CATALOG_CLASSES = ("org.apache.iceberg.spark.SparkCatalog", "org.apache.iceberg.spark.SparkSessionCatalog")
#: ``type`` -> pyiceberg's ``type``.
TYPES = {"rest": "rest", "hive": "hive", "glue": "glue", "jdbc": "sql"}
#: ``catalog-impl`` -> the ``type`` it is.
CATALOG_IMPLS = {
    "org.apache.iceberg.rest.RESTCatalog": "rest",
    "org.apache.iceberg.hive.HiveCatalog": "hive",
    "org.apache.iceberg.aws.glue.GlueCatalog": "glue",
    "org.apache.iceberg.jdbc.JdbcCatalog": "jdbc",
    "org.apache.iceberg.hadoop.HadoopCatalog": "hadoop",
    "org.apache.iceberg.nessie.NessieCatalog": "nessie",
}
#: Types Iceberg's Spark catalog has and pyiceberg has not: why, and what to do instead.
REFUSED_TYPES = {
    "hadoop": "pyiceberg has no Hadoop catalog (tables found by folder, committed by renaming a file), and kappa "
    "commits its tags, locks and publish through pyiceberg; register the tables in a jdbc, rest, hive or glue "
    "catalog (Iceberg's register_table procedure keeps their files)",
    "nessie": "pyiceberg has no Nessie catalog; Nessie serves the Iceberg REST API: use type rest with "
    "uri http(s)://<nessie>/iceberg",
}
#: FileIOs of ``io-impl``: pyiceberg picks its own FileIO by the location's scheme (s3://, gs://, abfs://, hdfs://).
FILE_IOS = (
    "org.apache.iceberg.aws.s3.S3FileIO",
    "org.apache.iceberg.hadoop.HadoopFileIO",
    "org.apache.iceberg.io.ResolvingFileIO",
    "org.apache.iceberg.gcp.gcs.GCSFileIO",
    "org.apache.iceberg.azure.adlsv2.ADLSFileIO",
)

#: Keys of every type: Spark's name -> pyiceberg's (``None``: used by Spark alone, not passed on).
COMMON: dict[str, str | None] = {
    "warehouse": "warehouse",
    "io-impl": None,
    "default-namespace": None,
    "cache-enabled": None,
    "cache.case-sensitive": None,
    "cache.expiration-interval-ms": None,
    "metrics-reporter-impl": None,
    "s3.endpoint": "s3.endpoint",
    "s3.access-key-id": "s3.access-key-id",
    "s3.secret-access-key": "s3.secret-access-key",
    "s3.session-token": "s3.session-token",
    "s3.path-style-access": "s3.force-virtual-addressing",  # negated
    "client.region": "client.region",
    "client.assume-role.arn": "client.role-arn",
    "client.assume-role.session-name": "client.role-session-name",
    "gcs.project-id": "gcs.project-id",
    "gcs.oauth2.token": "gcs.oauth2.token",
    "gcs.oauth2.token-expires-at": "gcs.oauth2.token-expires-at",
    "gcs.service.host": "gcs.service.host",
    "adls.auth.shared-key.account.name": "adls.account-name",
    "adls.auth.shared-key.account.key": "adls.account-key",
}
#: Keys of one type (besides :data:`COMMON`); REST also passes every ``header.*`` on.
BY_TYPE: dict[str, dict[str, str | None]] = {
    "rest": {
        "uri": "uri",
        "credential": "credential",
        "token": "token",
        "scope": "scope",
        "audience": "audience",
        "resource": "resource",
        "oauth2-server-uri": "oauth2-server-uri",
        "rest.auth.type": None,  # see _rest_auth
        "rest.sigv4-enabled": "rest.sigv4-enabled",
        "rest.signing-region": "rest.signing-region",
        "rest.signing-name": "rest.signing-name",
        "rest-page-size": "rest-page-size",
        "snapshot-loading-mode": "snapshot-loading-mode",
        "token-refresh-enabled": None,
        "rest-metrics-reporting-enabled": None,
    },
    "hive": {"uri": "uri", "clients": None},
    "glue": {"glue.id": "glue.id", "glue.skip-archive": "glue.skip-archive", "glue.endpoint": "glue.endpoint"},
    "jdbc": {
        "uri": "uri",  # see jdbc_to_sqlalchemy, with the connection's jdbc.* keys below
        "jdbc.schema-version": "schema_version",
        "jdbc.init-catalog-tables": "init_catalog_tables",
    },
}
#: ``rest.auth.type`` values pyiceberg's flat properties can carry: none/oauth2 (the credential or token as
#: given), sigv4 (``rest.sigv4-enabled``).
REST_AUTH_TYPES = ("none", "oauth2", "sigv4")
#: PostgreSQL JDBC connection properties (``jdbc.<name>`` or ``?name=`` of the URL) -> libpq's, for psycopg2.
PG_PARAMS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "ApplicationName": "application_name",
    "connectTimeout": "connect_timeout",
}
BY_TYPE["jdbc"].update({f"jdbc.{key}": None for key in ("user", "password", *PG_PARAMS)})

_SPARK_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PG_URL = re.compile(r"^jdbc:postgresql:(?://(?P<host>[^/?#]*))?/?(?P<database>[^?#]*)(?:\?(?P<query>[^#]*))?$")


def spark_catalog_properties(
    name: str, body: Mapping[str, Any], where: str, job_spark_conf: Mapping[str, str]
) -> dict[str, str] | None:
    """The pyiceberg properties of catalog ``name`` given as Spark conf; ``None`` when ``body`` is in neither
    Spark form (it is then pyiceberg properties).

    :param name: the catalog's name under ``catalogs:`` (the name kappa opens it by).
    :param body: the entry: ``{spark_conf: {...}}`` or ``{spark_catalog: <Spark catalog name>}``.
    :param where: the entry's dotted path in kappa.yaml, for messages.
    :param job_spark_conf: ``job.spark_conf``, which ``spark_catalog`` reads.
    :raises KappaConfigError: a Spark form mixed with other keys, or any key or value pyiceberg has no
        counterpart for; the message names the key, the value (never a secret) and what is allowed.
    """
    given = [k for k in FORMS if k in body]
    if not given:
        return None
    if len(body) != 1:
        others = sorted(str(k) for k in body if k != given[0])
        raise KappaConfigError(
            f"{where}: {given[0]!r} stands alone, got also {others}; allowed: exactly one of "
            "{spark_conf: {spark.sql.catalog.<name>...}}, {spark_catalog: <name in job.spark_conf>}, "
            "{conn_id: ...} or pyiceberg properties"
        )
    if given[0] == "spark_catalog":
        spark_name = _spark_name(body["spark_catalog"], f"{where}.spark_catalog")
        conf = {
            k: v
            for k, v in job_spark_conf.items()
            if k == PREFIX + spark_name or k.startswith(f"{PREFIX}{spark_name}.")
        }
        if not conf:
            raise KappaConfigError(
                f"{where}.spark_catalog: {spark_name!r} is not a Spark catalog of job.spark_conf (no key "
                f"{PREFIX}{spark_name}); defined there: {sorted(_names(job_spark_conf))}"
            )
        return _translate(name, spark_name, conf, "job.spark_conf")
    conf = _inline(body["spark_conf"], f"{where}.spark_conf")
    return _translate(name, _one_name(conf, f"{where}.spark_conf"), conf, f"{where}.spark_conf")


def _names(conf: Mapping[str, str]) -> set[str]:
    return {k[len(PREFIX) :] for k in conf if k.startswith(PREFIX) and "." not in k[len(PREFIX) :]}


def _spark_name(value: object, where: str) -> str:
    if not isinstance(value, str) or not _SPARK_NAME.match(value):
        raise KappaConfigError(f"{where}: {value!r} is not a Spark catalog name; expected letters, digits and '_'")
    return value


def _inline(value: object, where: str) -> dict[str, str]:
    """``spark_conf:`` of an entry: a non-empty mapping of ``spark.sql.catalog.*`` keys to scalars."""
    if not isinstance(value, dict) or not value:
        got = "an empty mapping" if isinstance(value, dict) else f"a {type(value).__name__}"  # never the value
        raise KappaConfigError(f"{where}: must be a mapping of spark.sql.catalog.<name>.* keys, got {got}")
    conf = {}
    for key, v in value.items():
        if not str(key).startswith(PREFIX):
            raise KappaConfigError(
                f"{where}: {str(key)!r} is not a catalog key; allowed: {PREFIX}<name> and {PREFIX}<name>.* "
                "(the job's other Spark conf goes in job.spark_conf)"
            )
        if isinstance(v, (dict, list)) or v is None:
            raise KappaConfigError(f"{where}.{key}: must be a string, number or boolean, got {type(v).__name__}")
        conf[str(key)] = str(v).lower() if isinstance(v, bool) else str(v)
    return conf


def _one_name(conf: Mapping[str, str], where: str) -> str:
    """The one Spark catalog the keys of an inline ``spark_conf`` configure."""
    names = sorted({k[len(PREFIX) :].split(".", 1)[0] for k in conf})
    if len(names) != 1:
        raise KappaConfigError(f"{where}: keys of {len(names)} Spark catalogs {names}; an entry is one catalog")
    return _spark_name(names[0], f"{where}.{PREFIX}{names[0]}")


def _translate(name: str, spark_name: str, conf: Mapping[str, str], where: str) -> dict[str, str]:
    """pyiceberg properties of the Spark catalog ``spark_name`` whose keys are ``conf`` (found at ``where``)."""
    head = PREFIX + spark_name
    props = {k[len(head) + 1 :]: v for k, v in conf.items() if k != head}
    cls = conf.get(head)
    if cls not in SPARK_CATALOG_CLASSES:
        got = "missing" if cls is None else repr(cls)
        raise KappaConfigError(f"{where}.{head}: {got}; allowed: {list(SPARK_CATALOG_CLASSES)} (Iceberg's catalogs)")
    kind = _kind(props, f"{where}.{head}")
    if kind == "jdbc" and spark_name != name:
        raise KappaConfigError(
            f"{where}.{head}: a jdbc catalog keys its tables by its name (iceberg_tables.catalog_name), and this "
            f"one is {spark_name!r} in Spark but {name!r} in kappa.yaml; name the kappa catalog {spark_name!r}"
        )
    out = {"type": TYPES[kind]}
    rules = {**COMMON, **BY_TYPE[kind]}
    for key, value in sorted(props.items()):
        at = f"{where}.{head}.{key}"
        if key in ("type", "catalog-impl"):
            continue
        if kind == "rest" and key.startswith("header.") and len(key) > len("header."):
            out[key] = value
        elif key not in rules:
            extra = ["header.*"] if kind == "rest" else []
            raise KappaConfigError(
                f"{at}: not a key kappa can pass to pyiceberg for type {kind!r}; allowed: {sorted(rules) + extra} "
                "(docs/catalogs.md: Spark catalog conf)"
            )
        elif (target := rules[key]) is not None:
            out[target] = value
    _special(out, kind, props, f"{where}.{head}")
    return out


def _kind(props: Mapping[str, str], where: str) -> str:
    """The catalog's type, from ``type`` or ``catalog-impl`` (neither: Iceberg's default, hive)."""
    if "type" in props and "catalog-impl" in props:
        raise KappaConfigError(f"{where}: both .type and .catalog-impl are set; Iceberg allows one of them")
    if "catalog-impl" in props:
        impl = props["catalog-impl"]
        if impl not in CATALOG_IMPLS:
            raise KappaConfigError(
                f"{where}.catalog-impl: {impl!r} is not a catalog kappa can open; allowed: {sorted(CATALOG_IMPLS)}"
            )
        kind, key = CATALOG_IMPLS[impl], "catalog-impl"
    else:
        kind, key = props.get("type", "hive").lower(), "type"
    if kind in REFUSED_TYPES:
        raise KappaConfigError(f"{where}.{key}: {props.get(key, kind)!r} cannot be used: {REFUSED_TYPES[kind]}")
    if kind not in TYPES:
        raise KappaConfigError(f"{where}.type: {kind!r} is not a catalog type; allowed: {sorted(TYPES)}")
    return kind


def _special(out: dict[str, str], kind: str, props: Mapping[str, str], where: str) -> None:
    """The keys that are not a rename: ``io-impl``, ``s3.path-style-access``, REST's auth, jdbc's URI; and ``uri``
    where pyiceberg needs one."""
    io_impl = props.get("io-impl")
    if io_impl is not None and io_impl not in FILE_IOS:
        raise KappaConfigError(
            f"{where}.io-impl: {io_impl!r} is not a FileIO kappa knows; allowed: {list(FILE_IOS)} (pyiceberg "
            "then picks its own FileIO by the location's scheme)"
        )
    path_style = props.get("s3.path-style-access")
    if path_style is not None:
        out["s3.force-virtual-addressing"] = {"true": "false", "false": "true"}.get(path_style.lower(), "")
        if not out["s3.force-virtual-addressing"]:
            raise KappaConfigError(f"{where}.s3.path-style-access: {path_style!r} must be true or false")
    if kind in ("rest", "hive", "jdbc") and not props.get("uri"):
        hint = " (Spark may take hive.metastore.uris from hive-site.xml; kappa reads no Hadoop config)"
        raise KappaConfigError(f"{where}.uri: missing; a {kind} catalog needs it{hint if kind == 'hive' else ''}")
    if kind == "rest":
        _rest_auth(out, props.get("rest.auth.type"), f"{where}.rest.auth.type")
    if kind == "jdbc":
        version = out.get("schema_version")
        if version is not None and version.lower() not in ("v0", "v1"):
            raise KappaConfigError(f"{where}.jdbc.schema-version: {version!r} is not a schema version; allowed: V0, V1")
        if version is not None:
            out["schema_version"] = version.lower()
        own = ("jdbc.schema-version", "jdbc.init-catalog-tables")
        connection = {k[len("jdbc.") :]: v for k, v in props.items() if k.startswith("jdbc.") and k not in own}
        out["uri"] = jdbc_to_sqlalchemy(props["uri"], connection, where)


def _rest_auth(out: dict[str, str], auth: str | None, where: str) -> None:
    if auth is None or auth.lower() in ("none", "oauth2"):
        return
    if auth.lower() == "sigv4":
        out["rest.sigv4-enabled"] = "true"
        return
    raise KappaConfigError(
        f"{where}: {auth!r} cannot be passed to pyiceberg; allowed: {list(REST_AUTH_TYPES)} (pyiceberg's other "
        "auth managers take nested settings, and kappa's catalog properties are flat strings)"
    )


def jdbc_to_sqlalchemy(uri: str, connection: Mapping[str, str], where: str) -> str:
    """The SQLAlchemy URL of a JDBC catalog's ``uri`` and connection properties (``jdbc.user``,
    ``jdbc.password``, ``jdbc.sslmode``...): ``jdbc:postgresql://h:5432/db`` + user + password ->
    ``postgresql+psycopg2://user:password@h:5432/db`` (user and password percent-encoded: SQLAlchemy decodes
    them); ``jdbc:sqlite:/abs/catalog.db`` -> ``sqlite:////abs/catalog.db``.

    :param uri: the JDBC URL.
    :param connection: the ``jdbc.*`` connection properties, without ``jdbc.`` (``user``, ``password``, ...).
    :param where: the Spark catalog's keys' dotted path, for messages (which mask the URL's credentials).
    :raises KappaConfigError: another database, a property given twice, or a URL of a form pyiceberg's
        SqlCatalog cannot open the same.
    """
    if uri.lower().startswith("jdbc:sqlite:"):
        if connection:
            raise KappaConfigError(
                f"{where}: jdbc.{sorted(connection)[0]} given for sqlite, which takes none; remove it"
            )
        return _sqlite(uri[len("jdbc:sqlite:") :], where)
    match = _PG_URL.match(uri)
    if match is None:
        raise KappaConfigError(
            f"{where}.uri: {redact_uri(uri)!r} is not a JDBC URL kappa can open; allowed: "
            "jdbc:postgresql://host[:port]/database[?params] and jdbc:sqlite:/absolute/path"
        )
    host = match.group("host") or "localhost"
    if "," in host or "@" in host:
        raise KappaConfigError(f"{where}.uri: {redact_uri(uri)!r} must name one host: jdbc:postgresql://host[:port]/db")
    params = dict(connection)
    for key, value in parse_qsl(match.group("query") or "", keep_blank_values=True):
        if params.setdefault(key, value) != value:
            raise KappaConfigError(f"{where}: {key!r} is given twice, as jdbc.{key} and in the uri; give it once")
    user, password = params.pop("user", None), params.pop("password", None)
    unknown = sorted(set(params) - set(PG_PARAMS))
    if unknown:
        raise KappaConfigError(
            f"{where}.uri: parameter {unknown[0]!r} has no libpq counterpart kappa knows; allowed: user, password, "
            f"{', '.join(PG_PARAMS)}"
        )
    auth = "" if user is None else quote(user, safe="") + ("" if password is None else ":" + quote(password, safe=""))
    query = "?" + urlencode(sorted((PG_PARAMS[k], v) for k, v in params.items())) if params else ""
    return f"postgresql+psycopg2://{auth}{'@' if auth else ''}{host}/{match.group('database')}{query}"


def _sqlite(path: str, where: str) -> str:
    """``sqlite:///`` + the absolute path of a ``jdbc:sqlite:`` URL (``jdbc:sqlite:file:/path`` too)."""
    path = path.removeprefix("file:")
    if not path.startswith("/") or any(c in path for c in "?%#"):
        raise KappaConfigError(
            f"{where}.uri: 'jdbc:sqlite:{path}' is not a sqlite file kappa can open; allowed: jdbc:sqlite:/absolute/path "
            "without '?', '%' or '#' (the driver, the tasks and Spark each have their own working folder; "
            "${CONFIG_DIR} is kappa.yaml's folder)"
        )
    return "sqlite:///" + path
