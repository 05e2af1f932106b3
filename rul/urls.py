"""The URLs users hand rul (the MLflow tracking store, the Optuna storage, the MLflow server's
backend): the one driver rule for a database URL, and what in a URL is secret.

- **The driver rule** (`with_driver`): `postgresql://` gets the driver the `postgres` extra
  installs (psycopg2) wherever rul hands the URL on; a URL naming its driver is kept.
- **Secrets** (`masked`, `secrets_of`): a URL's password and query values named like a secret
  (`password=`, `token=`...). What rul prints or logs shows the URL `masked`; `remember` keeps
  a URL's secrets for the process, so that `scrubbed` masks them in any text rul did not write
  itself (a library's error, a traceback, a warning) before it is shown.
"""

import re
from urllib.parse import parse_qsl, quote, unquote, urlsplit

MASK = "***"
# Query parameters whose value is a secret: libpq's and the usual names of web services.
SECRET_PARAMETER = re.compile(r"pass|secret|token|key|auth|credential|signature|sig$", re.I)

MIN_SCRUBBED = 3
# user:password@ inside a URL of any text: masked whatever the password
_URL_USERINFO = re.compile(r"(://[^/\s:@]+:)[^\s@/]+@")

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
    """The secret parts of `url` as written (the password, secret query values), longest
    first; [] for a text that is not a URL or holds none."""
    if not url or "://" not in url:
        return []
    parts = urlsplit(url)
    found = []
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    if ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    found += [value for name, value in parse_qsl(parts.query, keep_blank_values=True)
              if value and SECRET_PARAMETER.search(name)]
    written = {form for secret in found for form in (secret, unquote(secret), quote(secret))}
    return sorted((s for s in written if s), key=len, reverse=True)


def masked(url: str | None) -> str | None:
    """`url` as it may be printed or logged: each secret part replaced by ***."""
    if not url or "://" not in url:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:{MASK}@{host}"
    query = "&".join(
        f"{name}={MASK if value and SECRET_PARAMETER.search(name) else value}" if sep else name
        for name, sep, value in (pair.partition("=") for pair in parts.query.split("&") if pair))
    head = f"{parts.scheme}://{netloc}{parts.path}"
    return head + (f"?{query}" if parts.query else "") + (
        f"#{parts.fragment}" if parts.fragment else "")


def remember(*urls: str | None) -> None:
    """Keep the secrets of `urls` for `scrubbed`, for the rest of the process."""
    for url in urls:
        _remembered.update(secrets_of(url))


def scrubbed(text: str, *urls: str | None) -> str:
    """`text` with every secret of `urls` and of the URLs `remember`ed replaced by *** (one of
    fewer than MIN_SCRUBBED characters only inside a URL, or nothing would stay readable)."""
    for secret in sorted(_remembered.union(*(secrets_of(u) for u in urls)), key=len,
                         reverse=True):
        if len(secret) >= MIN_SCRUBBED:
            text = text.replace(secret, MASK)
    return _URL_USERINFO.sub(rf"\1{MASK}@", text)


def same_database(first: str | None, second: str | None) -> bool:
    """Whether two database server URLs name one database (whoever logs in, whatever driver):
    MLflow's and Optuna's tables cannot share one (one alembic version table)."""
    if not first or not second or "://" not in first or "://" not in second:
        return False
    a, b = urlsplit(with_driver(first)), urlsplit(with_driver(second))
    if a.scheme.split("+")[0] in ("sqlite", "file", "http", "https"):
        return False
    return (a.scheme.split("+")[0], a.hostname, a.port, a.path) == \
        (b.scheme.split("+")[0], b.hostname, b.port, b.path)
