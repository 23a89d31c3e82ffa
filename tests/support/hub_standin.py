"""A stand-in for the Hugging Face Hub on loopback, for tests with no network.

Two threaded HTTP servers: the Hub (``/api/models/...`` and ``/ORG/REPO/resolve/...``)
and a second origin, the "CDN", which the Hub redirects LFS files to, as
huggingface.co redirects to its storage.  They answer the routes and headers
huggingface_hub 2.x uses: ``X-Repo-Commit``, ``ETag`` and ``X-Linked-Etag`` (an
LFS file's sha256), ``X-Linked-Size``, ``X-Error-Code`` for its errors, ``Range``
on the CDN, and no Xet headers (so huggingface_hub downloads over plain HTTP).

Faults a test can set on :class:`StandInHub`: ``drop_after`` (the next CDN
transfer stops after that many bytes of the file and the connection closes;
``status_after_drop`` then becomes ``cdn_status``),
``cdn_status`` (the CDN answers every request with that status), ``throttle``
(seconds of sleep per 64 KiB sent), ``ignore_range`` (a 200 with the whole
file to a Range request), and per repository ``served`` (bytes the
CDN sends instead of the file, same size: a corrupt transfer).
"""
from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import unquote, urlsplit

TOKEN = "hf_standin_token"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
            f"size {len(data)}\n").encode()


@dataclass
class Repo:
    repo_id: str
    files: dict[str, bytes]
    private: bool = False
    gated: bool = False
    commit: str = "0" * 40
    served: dict[str, bytes] = field(default_factory=dict)  # path -> what the CDN sends instead

    def is_lfs(self, path: str) -> bool:
        return path.endswith(".gguf")

    def sibling(self, path: str) -> dict:
        data = self.files[path]
        if self.is_lfs(path):
            pointer = lfs_pointer(data)
            return {"rfilename": path, "size": len(data), "blobId": git_blob_id(pointer),
                    "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": len(pointer)}}
        return {"rfilename": path, "size": len(data), "blobId": git_blob_id(data)}


class StandInHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[dict] = []   # every request: origin, method, path, range, authorization
        self.drop_after: Optional[int] = None
        self.status_after_drop: Optional[int] = None  # becomes cdn_status once the drop happened
        self.cdn_status: Optional[int] = None
        self.throttle = 0.0
        self.ignore_range = False  # answer 200 with the whole file, as a CDN that ignores Range may
        self._blobs: dict[str, tuple[Repo, str]] = {}
        self._lock = threading.Lock()
        self.hub = self._serve(_HubHandler)
        self.cdn = self._serve(_CdnHandler)

    def _serve(self, handler) -> http.server.ThreadingHTTPServer:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        server.standin = self
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return server

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.hub.server_address[1]}"

    @property
    def cdn_origin(self) -> str:
        return f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def add(self, repo: Repo) -> Repo:
        self.repos[repo.repo_id] = repo
        for path in repo.files:
            if repo.is_lfs(path):
                self._blobs[f"{repo.commit[:8]}-{hashlib.sha256(repo.files[path]).hexdigest()}"] = (repo, path)
        return repo

    def stop(self) -> None:
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()

    def log(self, **entry) -> None:
        with self._lock:
            self.requests.append(entry)

    def cdn_gets(self) -> list[dict]:
        return [r for r in self.requests if r["origin"] == "cdn" and r["method"] == "GET"]

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: a dropped transfer is a closed socket
    origin = ""

    def log_message(self, *args) -> None:  # quiet
        pass

    @property
    def standin(self) -> StandInHub:
        return self.server.standin

    def do_HEAD(self):
        self._route("HEAD")

    def do_GET(self):
        self._route("GET")

    def _route(self, method: str) -> None:
        self.standin.log(origin=self.origin, method=method, path=urlsplit(self.path).path,
                         range=self.headers.get("Range"), authorization=self.headers.get("Authorization"))
        self.handle_request(method, unquote(urlsplit(self.path).path))

    def reply(self, status: int, headers: dict, body: bytes = b"", method: str = "GET") -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, str(value))
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method == "GET" and body:
            self.wfile.write(body)

    def error(self, status: int, code: str, message: str, method: str, commit: Optional[str] = None) -> None:
        body = json.dumps({"error": message}).encode()
        headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
        if commit:
            headers["X-Repo-Commit"] = commit
        self.reply(status, headers, body, method)


class _HubHandler(_Handler):
    origin = "hub"

    def handle_request(self, method: str, path: str) -> None:
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if api:
            repo = self._repo(api[1], method)
            if repo is not None and self._revision(repo, api[2] or "main", method):
                body = json.dumps({"id": repo.repo_id, "sha": repo.commit, "private": repo.private,
                                   "gated": "auto" if repo.gated else False,
                                   "siblings": [repo.sibling(p) for p in sorted(repo.files)]}).encode()
                self.reply(200, {"Content-Type": "application/json"}, body, method)
        elif resolve:
            repo = self._repo(resolve[1], method)
            if repo is None or not self._revision(repo, resolve[2], method):
                return
            file = resolve[3]
            if file not in repo.files:
                self.error(404, "EntryNotFound", "Entry not found", method, repo.commit)
                return
            data = repo.files[file]
            headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
            if repo.is_lfs(file):
                sha = hashlib.sha256(data).hexdigest()
                headers.update({"ETag": f'"{git_blob_id(lfs_pointer(data))}"', "X-Linked-Etag": f'"{sha}"',
                                "X-Linked-Size": len(data),
                                "Location": f"{self.standin.cdn_origin}/blobs/{repo.commit[:8]}-{sha}"})
                self.reply(302, headers, b"", method)
            else:
                headers["ETag"] = f'"{git_blob_id(data)}"'
                self.reply(200, headers, data, method)
        else:
            self.error(404, "NotFound", "no such route", method)

    def _repo(self, repo_id: str, method: str) -> Optional[Repo]:
        repo = self.standin.repos.get(repo_id)
        authorized = self.headers.get("Authorization") == f"Bearer {TOKEN}"
        if repo is None:
            self.error(404 if authorized else 401, "RepoNotFound", "Repository not found", method)
            return None
        if repo.private and not authorized:
            self.error(401, "RepoNotFound", "Repository not found", method)
            return None
        if repo.gated and not authorized:
            self.error(401, "GatedRepo", "Access to this model is restricted: you must be authenticated", method)
            return None
        return repo

    def _revision(self, repo: Repo, revision: str, method: str) -> bool:
        if revision in ("main", repo.commit):
            return True
        self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}", method)
        return False


class _CdnHandler(_Handler):
    origin = "cdn"

    def handle_request(self, method: str, path: str) -> None:
        standin = self.standin
        match = re.fullmatch(r"/blobs/([0-9a-f]{8}-[0-9a-f]{64})", path)
        if match is None or match[1] not in standin._blobs:
            self.reply(404, {}, b"not found", method)
            return
        if standin.cdn_status is not None:
            self.reply(standin.cdn_status, {}, b"unavailable", method)
            return
        repo, file = standin._blobs[match[1]]
        data = repo.served.get(file, repo.files[file])
        start = 0
        range_header = self.headers.get("Range")
        headers = {"Accept-Ranges": "bytes", "ETag": f'"{hashlib.sha256(repo.files[file]).hexdigest()}"',
                   "Content-Type": "application/octet-stream"}
        status = 200
        if range_header and not standin.ignore_range:
            wanted = re.fullmatch(r"bytes=(\d+)-", range_header)
            start = int(wanted[1]) if wanted else 0
            if start >= len(data):
                self.reply(416, {"Content-Range": f"bytes */{len(data)}"}, b"", method)
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        headers["Content-Length"] = len(data) - start
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, str(value))
        self.end_headers()
        if method != "GET":
            return
        stop = len(data)
        drop = standin.drop_after
        if drop is not None and start < drop:
            standin.drop_after = None  # once
            standin.cdn_status = standin.status_after_drop
            stop = drop
        position = start
        try:
            while position < stop:
                chunk = data[position:min(stop, position + 65536)]
                self.wfile.write(chunk)
                self.wfile.flush()
                position += len(chunk)
                if standin.throttle:
                    time.sleep(standin.throttle)
        except (BrokenPipeError, ConnectionResetError):
            return
        if stop < len(data):  # a dropped connection, half way
            self.close_connection = True
            self.connection.shutdown(2)
