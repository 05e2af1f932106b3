"""The URLs users hand rul (the MLflow tracking store, the Optuna storage, the MLflow server's
backend): the one driver rule for a database URL, and what in a URL is secret.

- **The driver rule** (`with_driver`): `postgresql://` gets the driver the `postgres` extra
  installs (psycopg2) wherever rul hands the URL on; a URL naming its driver is kept.
- **Secrets** (`masked`, `secrets_of`): a URL's password (to the last @: it may hold / and :)
  and every NAME=value whose name says secret (`password=`, `access_token=`, a .env line's
  `MLFLOW_TRACKING_PASSWORD=`). What rul prints or logs shows a URL `masked`; `remember` keeps
  a URL's secrets for the process, so that `scrubbed` masks them, and applies the same rule,
  in any text rul did not write itself (a library's error, a traceback, a warning, a file's
  content quoted in an error) before it is shown.
"""

import re
from urllib.parse import quote, unquote, urlsplit

MASK = "***"
# Names whose value is a secret, in a URL's query or a NAME=value anywhere (a .env line quoted
# in an error): libpq's and the usual names of web services.
SECRET_PARAMETER = re.compile(r"pass|secret|token|key|auth|credential|signature|sig$", re.I)

MIN_SCRUBBED = 3
# scheme://user:password@: the password runs to the last @ of the URL (SQLAlchemy reads one
# holding / and :, urllib one holding @), so that no spelling of it is printed; a quote or a
# space ends a URL in text. (A URL with a port and an @ further on, in its path or query, is
# masked from the port on: more than its secret, never less.)
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][\w+.-]*://[^:/@?#\s'\"<>]*:)"
                       r"(?P<password>[^\s'\"<>]*)@")
# NAME=value: a query parameter, or a line of a .env file or an environment. The value runs to
# a space, an & or a quote (or is quoted); one closing ) ] , ; . after it is punctuation.
_ASSIGNED = re.compile(r"(?P<name>\b[A-Za-z_][\w.-]*)="
                       r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s&'\"]*[^\s&'\"),;\].])")

_remembered: set[str] = set()


def with_driver(url: str) -> str:
    """`postgresql://` with the driver the `postgres` extra installs (psycopg2); SQLAlchemy
    2.1 would pick psycopg 3 otherwise. An explicit `postgresql+driver://` is kept."""
    return "postgresql+psycopg2://" + url.removeprefix("postgresql://") \
        if url.startswith("postgresql://") else url


# The Python module each database URL's driver needs, and the install that brings it.
DRIVERS = {"postgresql+psycopg2": ("psycopg2", "pip install 'rul[postgres]'"),
           "postgresql+psycopg": ("psycopg", "pip install 'psycopg[binary]'"),
           "mysql+pymysql": ("pymysql", "pip install pymysql"),
           "mysql": ("MySQLdb", "pip install mysqlclient")}


def missing_driver(url: str) -> str | None:
    """What to install when the driver of database URL `url` is not importable (checked
    without importing it); None when it is there or `url` names no known driver."""
    import importlib.util

    scheme = with_driver(url).split("://", 1)[0]
    module, install = DRIVERS.get(scheme, (None, None))
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return f"its driver {module} is not installed: {install}"


def secrets_of(url: str | None) -> list[str]:
    """The secret parts of `url` as written (the password, secret query values), as written,
    percent-decoded and encoded, longest first; [] for a text that is not a URL or holds none."""
    if not url or "://" not in url:
        return []
    found = [m.group("password") for m in _USERINFO.finditer(url)]
    found += [m.group("value").strip("'\"") for m in _ASSIGNED.finditer(url.partition("?")[2])
              if SECRET_PARAMETER.search(m.group("name"))]
    written = {form for secret in found
               for form in (secret, unquote(secret), quote(secret, safe=""))}
    return sorted((s for s in written if s), key=len, reverse=True)


def masked(url: str | None) -> str | None:
    """`url` as it may be printed or logged: each secret part replaced by ***."""
    if not url or "://" not in url:
        return url
    return _masked_parts(url)


def _masked_parts(text: str) -> str:
    """`text` with every URL's password and every secret NAME=value masked: the one rule."""
    text = _USERINFO.sub(lambda m: f"{m.group('head')}{MASK}@", text)
    return _ASSIGNED.sub(lambda m: f"{m.group('name')}={MASK}"
                         if SECRET_PARAMETER.search(m.group("name")) else m.group(), text)


def remember(*urls: str | None) -> None:
    """Keep the secrets of `urls` for `scrubbed`, for the rest of the process."""
    for url in urls:
        _remembered.update(secrets_of(url))


def scrubbed(text: str, *urls: str | None) -> str:
    """`text` with every secret of `urls` and of the URLs `remember`ed replaced by *** (one of
    fewer than MIN_SCRUBBED characters only inside a URL, or nothing would stay readable), and
    masked as `masked` masks a URL: a password in any URL, a secret NAME=value."""
    for secret in sorted(_remembered.union(*(secrets_of(u) for u in urls)), key=len,
                         reverse=True):
        if len(secret) >= MIN_SCRUBBED:
            text = text.replace(secret, MASK)
    return _masked_parts(text)


def same_database(first: str | None, second: str | None) -> bool:
    """Whether two database server URLs name one database (whoever logs in, whatever driver):
    MLflow's and Optuna's tables cannot share one (one alembic version table)."""
    if not first or not second or "://" not in first or "://" not in second:
        return False
    a, b = (urlsplit(_USERINFO.sub(r"\g<head>@", with_driver(url)))  # a password may hold /
            for url in (first, second))
    if a.scheme.split("+")[0] in ("sqlite", "file", "http", "https"):
        return False
    return (a.scheme.split("+")[0], a.hostname, a.port, a.path) == \
        (b.scheme.split("+")[0], b.hostname, b.port, b.path)
