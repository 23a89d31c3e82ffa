"""Where pip is configured to look for packages, so elelem's own downloads look in the same places.

The settings come from ``python -m pip config list``, which merges pip's config
files (``/etc/pip.conf``, ``~/.config/pip/pip.conf``, ``$PIP_CONFIG_FILE``, the
virtual environment's) and its ``PIP_*`` environment variables.  Asking pip,
rather than reading those files ourselves, keeps pip's own rules about which
file wins.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

log = logging.getLogger("elelem")

PYPI_SIMPLE = "https://pypi.org/simple/"

# pip's order for a `pip download` run: [global], then [download], then PIP_* variables.
_SECTION_ORDER = ("global", "download", ":env:")


@dataclass(frozen=True)
class PipSettings:
    index_urls: tuple[str, ...]  # index-url first, then each extra-index-url (empty with no-index)
    find_links: tuple[str, ...]  # folders or pages of links to wheel files
    cert: str | None  # a CA bundle to verify HTTPS with
    timeout: float
    proxy: str | None


def read_pip_settings() -> PipSettings:
    """pip's effective index settings; PyPI alone when pip cannot be asked."""
    return parse_pip_config(_pip_config_list())


def parse_pip_config(listing: str) -> PipSettings:
    """Build the settings from ``pip config list`` output (``section.key='value'`` lines)."""
    by_section: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        section, dot, option = key.rpartition(".")
        if not sep or not dot:
            continue
        try:
            words = shlex.split(value)  # pip quotes each value as a Python repr
        except ValueError:
            continue
        by_section.setdefault(section, {})[option.replace("_", "-")] = " ".join(words)
    merged: dict[str, str] = {}
    for section in _SECTION_ORDER:
        merged.update(by_section.get(section, {}))

    no_index = _truthy(merged.get("no-index", ""))
    indexes = [] if no_index else [merged.get("index-url") or PYPI_SIMPLE, *merged.get("extra-index-url", "").split()]
    return PipSettings(
        index_urls=tuple(indexes),
        find_links=tuple(merged.get("find-links", "").split()),
        cert=merged.get("cert") or None,
        timeout=_number(merged.get("timeout") or merged.get("default-timeout"), 15.0),
        proxy=merged.get("proxy") or None,
    )


def _pip_config_list() -> str:
    try:
        result = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                                text=True, timeout=60, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("could not ask pip for its index settings (%s); using PyPI", error)
        return ""
    if result.returncode != 0:
        log.warning("`pip config list` failed (%s); using PyPI", result.stderr.strip()[-500:])
        return ""
    log.debug("pip config list:\n%s", re.sub(r"://[^/@\s']+@", "://****@", result.stdout.rstrip()))  # no passwords
    return result.stdout


def _truthy(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def _number(text: str | None, default: float) -> float:
    try:
        return float(text) if text else default
    except ValueError:
        return default
