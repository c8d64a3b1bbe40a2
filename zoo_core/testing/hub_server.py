"""A strict Hugging Face Hub-protocol server on loopback, for testing publish and pull with the
**real** ``huggingface_hub`` client and no network.

Start it, point the client at it with ``HF_ENDPOINT`` (set *before* ``huggingface_hub`` is
imported: the client reads its constants once), and use ``HfApi`` / ``snapshot_download`` /
``hf`` as usual::

    with HubServer() as hub:
        os.environ.update(hub.environ())          # HF_ENDPOINT, HF_TOKEN, HF_HUB_DISABLE_XET=1, ...
        ...                                       # real client calls

What it implements is only what the client calls (each route names the client function that
needs it), and it is strict so that it catches misuse:

- writes need ``Authorization: Bearer <write token>`` (401 otherwise); private repos are invisible
  without a token (401 + ``X-Error-Code: RepoNotFound``, as the Hub answers);
- LFS uploads are checked against their oid: sha256 and size must match (400 otherwise); a commit
  that names an LFS object that was never uploaded is refused (400);
- a commit with a ``parentCommit`` that is not the branch head is refused (412); commits go to
  branches only, and to a branch that exists;
- duplicate repos, tags and branches give 409 (the client maps this to ``exist_ok``);
- ``HEAD/GET /{repo}/resolve/{rev}/{path}`` answer with the Hub's headers (``X-Repo-Commit``,
  ``ETag``, ``X-Linked-Etag``, ``X-Linked-Size``) and serve LFS content through a 302 to a second
  host name (``localhost`` when the API is ``127.0.0.1``: same socket, another host, as the Hub
  redirects to its CDN), so a test can check the client never sends its token there;
- 404s carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``), which is
  what the client maps to its exception classes.

The server does not speak Xet. ``huggingface_hub`` >= 1.x uploads through Xet whenever ``hf_xet``
is installed, unless ``HF_HUB_DISABLE_XET=1``; the Xet token routes here answer 501 with a message
saying so. Downloads never use Xet here because the resolve responses carry no Xet headers.

Faults (``add_fault``) are deterministic and counted: drop the connection, answer a status
(5xx once or always), truncate a body, flip a byte in a body (same size), stall, or go away (every
later request is dropped, as if the server died mid-pull). Every request is logged
(``requests``) so tests can assert exact round trips, e.g. "0 requests while offline".

``mirror(etag=..., paths_info=...)`` makes it answer as a mirror or proxy that is not the Hub:
``etag`` is the ETag form of ``resolve`` (``hub``: git sha1 + ``X-Linked-Etag`` sha256 as the Hub;
``md5``: an md5 of the content, as S3-backed mirrors; ``weak``: ``W/"<size>-<md5 prefix>"``, as
nginx; ``sha512``: a hex digest of another length; ``none``: no ETag at all), and
``paths_info=False`` drops the file hashes from ``paths-info`` and ``model_info`` (404 / no
``lfs`` / ``blobId``), so a client has no sha256 it can trust.

What this does **not** prove: Xet transfer, auth scopes and fine-grained tokens, gated repos,
rate limits, multipart LFS uploads (files > 5 GB), server-side model-card rules beyond YAML
parsing, pagination of long listings, and any drift of the real Hub's responses from what is
implemented here. An opt-in smoke test against the real Hub covers the first three partially.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["ETAG_FORMS", "READ_TOKEN", "WRITE_TOKEN", "Fault", "HubServer", "RequestRecord", "git_blob_sha1"]

WRITE_TOKEN = "hf_zoo_loopback_write_token"
READ_TOKEN = "hf_zoo_loopback_read_token"
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".npz", ".npy", ".h5", ".onnx", ".gz", ".zip", ".png")
_LFS_MIN_SIZE = 10 * 1024 * 1024
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO = rf"(?P<repo>{_NAME}/{_NAME})"
ETAG_FORMS = ("hub", "md5", "weak", "sha512", "none")


def git_blob_sha1(data: bytes) -> str:
    """Git's object id of a blob: sha1(b"blob <size>\\0" + data), what the Hub uses as a regular file's etag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass
class _File:
    path: str
    size: int
    git_oid: str
    sha256: str | None = None  # set for LFS files (content lives in the LFS store)
    data: bytes | None = None  # set for regular files

    def entry(self) -> dict[str, Any]:
        """A tree / paths-info entry (HfApi.list_repo_tree, get_paths_info)."""
        out: dict[str, Any] = {"type": "file", "oid": self.git_oid, "size": self.size, "path": self.path}
        if self.sha256 is not None:
            out["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(_lfs_pointer(self.sha256, self.size))}
        return out


@dataclass
class _Commit:
    oid: str
    parent: str | None
    files: dict[str, _File]
    title: str
    created: float


@dataclass
class _Repo:
    repo_id: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    pulls: dict[str, str] = field(default_factory=dict)  # "refs/pr/N" -> commit
    commits: dict[str, _Commit] = field(default_factory=dict)


@dataclass
class RequestRecord:
    """One request as the server saw it."""

    method: str
    host: str
    path: str
    authorized: bool  # an Authorization header was sent
    status: int | None = None  # None when the connection was dropped


@dataclass
class Fault:
    """A fault applied to the next ``times`` matching requests (``times=None``: all of them).

    kinds: ``drop`` (close the connection without answering), ``status`` (answer ``status``),
    ``truncate`` (announce the full length, send ``fraction`` of the body, close), ``corrupt``
    (flip one byte, same size), ``stall`` (sleep ``seconds`` before answering), ``gone`` (from this
    request on, drop every request: the server died).
    """

    kind: str
    method: str | None = None
    path: str | None = None  # a regular expression searched in the request path
    times: int | None = 1
    status: int = 500
    fraction: float = 0.5
    seconds: float = 0.0
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and self.method != method:
            return False
        return self.path is None or re.search(self.path, path) is not None


class _HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class _Drop(Exception):
    """Close the connection without an answer."""


class HubServer:
    """The loopback Hub. ``url`` is the API host (127.0.0.1), ``cdn_url`` the content host (localhost)."""

    def __init__(self, *, tokens: dict[str, str] | None = None, user: str = "zoo-tester") -> None:
        self.tokens = dict(tokens) if tokens is not None else {WRITE_TOKEN: "write", READ_TOKEN: "read"}
        self.user = user
        self.repos: dict[str, _Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[RequestRecord] = []
        self.faults: list[Fault] = []
        self.gone = False
        self.etag_form = "hub"
        self.paths_info = True
        self._lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._counter = 0

    # lifecycle --------------------------------------------------------------------------
    def start(self) -> HubServer:
        handler = type("Handler", (_Handler,), {"hub": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="zoo-hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the server is not running; call start() first")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cdn_url(self) -> str:
        return f"http://localhost:{self.port}"

    def environ(self, *, token: str | None = WRITE_TOKEN) -> dict[str, str]:
        """Environment for a client process: set it before importing huggingface_hub."""
        env = {
            "HF_ENDPOINT": self.url,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_ETAG_TIMEOUT": "2",
            "HF_HUB_DOWNLOAD_TIMEOUT": "2",
        }
        if token is not None:
            env["HF_TOKEN"] = token
        return env

    # test helpers ---------------------------------------------------------------------
    def add_fault(self, kind: str, **kw: Any) -> Fault:
        if kind not in ("drop", "status", "truncate", "corrupt", "stall", "gone"):
            raise ValueError(f"unknown fault kind {kind!r}")
        fault = Fault(kind, **kw)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        """Forget faults, mirror settings and the request log (repos are kept)."""
        with self._lock:
            self.faults.clear()
            self.requests.clear()
            self.gone = False
            self.etag_form, self.paths_info = "hub", True

    def mirror(self, *, etag: str = "hub", paths_info: bool = True) -> None:
        """Answer downloads as a mirror would: the ETag form of ``resolve``, and whether file hashes are served."""
        if etag not in ETAG_FORMS:
            raise ValueError(f"unknown ETag form {etag!r}; one of {', '.join(ETAG_FORMS)}")
        with self._lock:
            self.etag_form, self.paths_info = etag, paths_info

    def etag_headers(self, f: _File) -> dict[str, str]:
        """The ETag headers ``resolve`` sends for a file under the current ``etag_form``."""
        if self.etag_form == "hub":
            if f.sha256 is not None:
                return {"ETag": f'"{f.git_oid}"', "X-Linked-Etag": f'"{f.sha256}"'}
            return {"ETag": f'"{f.git_oid}"'}
        content = self.lfs[f.sha256] if f.sha256 is not None else f.data or b""
        md5 = hashlib.md5(content).hexdigest()
        return {"md5": {"ETag": f'"{md5}"'}, "weak": {"ETag": f'W/"{len(content):x}-{md5[:8]}"'},
                "sha512": {"ETag": f'"{hashlib.sha512(content).hexdigest()}"'}, "none": {}}[self.etag_form]

    def count(self, method: str | None = None, pattern: str = "") -> int:
        """How many logged requests match ``method`` and the regular expression ``pattern``."""
        with self._lock:
            return sum(1 for r in self.requests if (method is None or r.method == method) and re.search(pattern, r.path))

    def head(self, repo_id: str, branch: str = "main") -> str:
        """The commit a branch points to."""
        return self.repos[repo_id].branches[branch]

    # store ----------------------------------------------------------------------------
    def _new_oid(self, *parts: str) -> str:
        with self._lock:
            self._counter += 1
            return hashlib.sha1("\0".join((*parts, str(self._counter), secrets.token_hex(4))).encode()).hexdigest()

    def _repo(self, repo_id: str, authorized_read: bool) -> _Repo:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and not authorized_read):
            status = 404 if authorized_read else 401
            raise _HubError(status, "Repository not found", "RepoNotFound")
        return repo

    @staticmethod
    def _resolve(repo: _Repo, rev: str) -> str:
        rev = unquote(rev)
        for refs in (repo.branches, repo.tags, repo.pulls):
            if rev in refs:
                return refs[rev]
        if re.fullmatch(r"[0-9a-f]{40}", rev) and rev in repo.commits:
            return rev
        raise _HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")


_ROUTES: list[tuple[str, re.Pattern[str], str]] = []


def _route(method: str, pattern: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _ROUTES.append((method, re.compile(pattern), fn.__name__))
        return fn

    return deco


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: avoid 40 ms delayed-ACK stalls
    server_version = "zoo-loopback-hub/1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    # plumbing ---------------------------------------------------------------------------
    def _token_role(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if not auth:
            return None
        if not auth.startswith("Bearer "):
            raise _HubError(401, "Invalid credentials in Authorization header")
        role = self.hub.tokens.get(auth[7:])
        if role is None:
            raise _HubError(401, "Invalid credentials in Authorization header")
        return role

    def _need_write(self) -> None:
        role = self._token_role()
        if role is None:
            raise _HubError(401, "You must be authenticated to access this resource (no token was sent).")
        if role != "write":
            raise _HubError(403, "You don't have the rights to write to this repository (read-only token).")

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(length) if length else b""

    def _json_body(self) -> Any:
        raw = self._body
        try:
            return json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            raise _HubError(400, f"request body is not JSON: {exc}") from None

    def _dispatch(self, method: str) -> None:
        hub = self.hub
        split = urlsplit(self.path)
        self._query = parse_qs(split.query)
        path = split.path
        record = RequestRecord(method, self.headers.get("Host", ""), self.path, "Authorization" in self.headers)
        with hub._lock:
            hub.requests.append(record)
            fault = next((f for f in hub.faults if f.matches(method, path)), None)
            if fault is not None:
                fault.hits += 1
            if fault is not None and fault.kind == "gone":
                hub.gone = True
        self._body = self._read_body()
        self._body_fault = fault if fault is not None and fault.kind in ("truncate", "corrupt") else None
        self._record = record
        self._error_commit: str | None = None
        try:
            if hub.gone:
                raise _Drop
            if fault is not None and fault.kind == "drop":
                raise _Drop
            if fault is not None and fault.kind == "stall":
                time.sleep(fault.seconds)
            if fault is not None and fault.kind == "status":
                raise _HubError(fault.status, f"injected fault: {fault.status}")
            for m, pattern, name in _ROUTES:
                match = pattern.fullmatch(path)
                if match and m == method.replace("HEAD", "GET"):
                    getattr(self, name)(**match.groupdict())
                    return
            raise _HubError(404, f"the loopback Hub does not implement {method} {path}")
        except _Drop:
            record.status = None
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        except _HubError as exc:
            headers = {"X-Error-Message": exc.message}
            if exc.code:
                headers["X-Error-Code"] = exc.code
            if self._error_commit:
                headers["X-Repo-Commit"] = self._error_commit
            self._send(exc.status, json.dumps({"error": exc.message}).encode(), headers, ctype="application/json")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, *,
              ctype: str = "application/octet-stream", length: int | None = None) -> None:
        self._record.status = status
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command == "HEAD":
            return
        fault = self._body_fault
        if fault is not None and status < 300 and body:
            if fault.kind == "corrupt":
                pos = len(body) // 2
                body = body[:pos] + bytes([body[pos] ^ 0xFF]) + body[pos + 1 :]
            elif fault.kind == "truncate":
                self.wfile.write(body[: int(len(body) * fault.fraction)])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
        self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers, ctype="application/json")

    def _repo_for_read(self, repo: str) -> _Repo:
        return self.hub._repo(repo, authorized_read=self._token_role() is not None)

    def _repo_for_write(self, repo: str) -> _Repo:
        self._need_write()
        return self.hub._repo(repo, authorized_read=True)

    # account and repos ----------------------------------------------------------------
    @_route("GET", r"/api/whoami-v2")
    def whoami(self) -> None:  # HfApi.whoami
        if self._token_role() is None:
            raise _HubError(401, "Invalid username or password.")
        self._json({"type": "user", "name": self.hub.user, "orgs": [], "auth": {"type": "access_token"}})

    @_route("POST", r"/api/repos/create")
    def create_repo(self) -> None:  # HfApi.create_repo
        self._need_write()
        body = self._json_body()
        if body.get("type", "model") != "model":
            raise _HubError(400, "the loopback Hub holds model repos only")
        name, org = body.get("name"), body.get("organization")
        repo_id = f"{org}/{name}" if org else f"{self.hub.user}/{name}"
        if not isinstance(name, str) or not re.fullmatch(rf"{_NAME}/{_NAME}", repo_id) or ".." in repo_id or "--" in repo_id:
            raise _HubError(400, f"invalid repo name {repo_id!r}")
        url = f"{self.hub.url}/{repo_id}"
        with self.hub._lock:
            if repo_id in self.hub.repos:
                self._json({"error": "You already created this model repo", "url": url}, status=409)
                return
            private = bool(body.get("private")) or body.get("visibility") == "private"
            repo = _Repo(repo_id, private)
            attrs = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
            initial = _Commit(self.hub._new_oid(repo_id), None,
                              {".gitattributes": _File(".gitattributes", len(attrs), git_blob_sha1(attrs), data=attrs)},
                              "initial commit", time.time())
            repo.commits[initial.oid] = initial
            repo.branches["main"] = initial.oid
            self.hub.repos[repo_id] = repo
        self._json({"url": url, "name": repo_id, "id": secrets.token_hex(12)})

    @_route("POST", r"/api/validate-yaml")
    def validate_yaml(self) -> None:  # HfApi.create_commit / upload_file when README.md is uploaded
        import yaml

        content = self._json_body().get("content", "")
        match = re.match(r"^---\s*\n(.*?)\n---\s*\n", content, re.DOTALL)
        errors = []
        if match:
            try:
                meta = yaml.safe_load(match.group(1))
                if meta is not None and not isinstance(meta, dict):
                    errors.append({"message": "the front matter is not a mapping"})
            except yaml.YAMLError as exc:
                errors.append({"message": f"invalid YAML: {exc}"})
        self._json({"errors": errors, "warnings": []}, status=400 if errors else 200)

    @_route("GET", rf"/api/models/{_REPO}(?:/revision/(?P<rev>.+))?")
    def model_info(self, repo: str, rev: str | None = None) -> None:  # HfApi.model_info / repo_info
        r = self._repo_for_read(repo)
        oid = self.hub._resolve(r, rev or "main")
        commit = r.commits[oid]
        blobs = self._query.get("blobs") == ["true"] or "expand" in self._query
        siblings = []
        for f in sorted(commit.files.values(), key=lambda f: f.path):
            sib: dict[str, Any] = {"rfilename": f.path}
            if blobs and self.hub.paths_info:
                sib.update(size=f.size, blobId=f.git_oid)
                if f.sha256:
                    sib["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": len(_lfs_pointer(f.sha256, f.size))}
            siblings.append(sib)
        modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(commit.created))
        self._json({"_id": secrets.token_hex(12), "id": repo, "modelId": repo, "author": repo.split("/")[0],
                    "sha": oid, "lastModified": modified, "createdAt": modified, "private": r.private,
                    "disabled": False, "gated": False, "downloads": 0, "likes": 0, "tags": [],
                    "siblings": siblings})

    @_route("GET", rf"/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<sub>.*))?")
    def tree(self, repo: str, rev: str, sub: str | None = None) -> None:  # HfApi.list_repo_tree
        r = self._repo_for_read(repo)
        commit = r.commits[self.hub._resolve(r, rev)]
        recursive = self._query.get("recursive", ["false"])[0].lower() == "true"
        prefix = (sub or "").strip("/")
        entries: dict[str, dict[str, Any]] = {}
        for f in commit.files.values():
            if prefix and not f.path.startswith(prefix + "/"):
                continue
            rest = f.path[len(prefix) + 1 :] if prefix else f.path
            parts = rest.split("/")
            base = f"{prefix}/" if prefix else ""
            for depth in range(1, len(parts)):
                if not recursive and depth > 1:
                    break
                folder = base + "/".join(parts[:depth])
                entries.setdefault(folder, {"type": "directory", "oid": git_blob_sha1(folder.encode()), "size": 0, "path": folder})
            if recursive or len(parts) == 1:
                entries[f.path] = f.entry()
        if prefix and not entries:
            raise _HubError(404, f"{prefix} does not exist at this revision", "EntryNotFound")
        self._json([entries[k] for k in sorted(entries)])

    @_route("POST", rf"/api/models/{_REPO}/paths-info/(?P<rev>[^/]+)")
    def paths_info(self, repo: str, rev: str) -> None:  # HfApi.get_paths_info
        r = self._repo_for_read(repo)
        commit = r.commits[self.hub._resolve(r, rev)]
        if not self.hub.paths_info:
            raise _HubError(404, f"the loopback Hub does not implement POST {self.path} (mirror(paths_info=False))")
        ctype = self.headers.get("Content-Type", "")
        paths = self._json_body().get("paths", []) if "json" in ctype else parse_qs(self._body.decode()).get("paths", [])
        self._json([commit.files[p].entry() for p in paths if p in commit.files])

    @_route("GET", rf"/api/models/{_REPO}/refs")
    def refs(self, repo: str) -> None:  # HfApi.list_repo_refs
        r = self._repo_for_read(repo)
        out: dict[str, Any] = {
            "branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c} for n, c in sorted(r.branches.items())],
            "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": c} for n, c in sorted(r.tags.items())],
            "converts": [],
        }
        if self._query.get("include_prs") == ["1"]:
            out["pullRequests"] = [{"name": n, "ref": n, "targetCommit": c} for n, c in sorted(r.pulls.items())]
        self._json(out)

    @_route("POST", rf"/api/models/{_REPO}/tag/(?P<rev>[^/]+)")
    def create_tag(self, repo: str, rev: str) -> None:  # HfApi.create_tag
        r = self._repo_for_write(repo)
        tag = self._json_body().get("tag")
        if not isinstance(tag, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", tag):
            raise _HubError(400, f"invalid tag name {tag!r}")
        with self.hub._lock:
            if tag in r.tags:
                raise _HubError(409, f"Tag {tag} already exists")
            r.tags[tag] = self.hub._resolve(r, rev)
        self._json({})

    @_route("POST", rf"/api/models/{_REPO}/branch/(?P<branch>.+)")
    def create_branch(self, repo: str, branch: str) -> None:  # HfApi.create_branch
        r = self._repo_for_write(repo)
        branch = unquote(branch)
        start = self._json_body().get("startingPoint")
        with self.hub._lock:
            if branch in r.branches:
                raise _HubError(409, f"Reference refs/heads/{branch} already exists")
            r.branches[branch] = self.hub._resolve(r, start or "main")
        self._json({})

    @_route("GET", rf"/api/models/{_REPO}/xet-(?:write|read)-token/(?P<rev>.+)")
    def xet_token(self, repo: str, rev: str) -> None:  # hf_xet sessions (not supported here)
        raise _HubError(501, "the loopback Hub does not speak Xet: set HF_HUB_DISABLE_XET=1 before importing huggingface_hub")

    # upload -----------------------------------------------------------------------------
    @_route("POST", rf"/api/models/{_REPO}/preupload/(?P<rev>[^/]+)")
    def preupload(self, repo: str, rev: str) -> None:  # _commit_api._fetch_upload_modes
        r = self._repo_for_write(repo)
        head = r.commits.get(r.branches.get(unquote(rev), ""))
        out = []
        for item in self._json_body().get("files", []):
            path, size = item["path"], int(item["size"])
            sample = base64.b64decode(item.get("sample", ""))
            lfs = path.endswith(_LFS_SUFFIXES) or size >= _LFS_MIN_SIZE or b"\0" in sample
            existing = head.files.get(path) if head else None
            oid = None if existing is None else (existing.sha256 or existing.git_oid)
            out.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
        self._json({"files": out, "commitOid": head.oid if head else None})

    @_route("POST", rf"/{_REPO}\.git/info/lfs/objects/batch")
    def lfs_batch(self, repo: str) -> None:  # lfs.post_lfs_batch_info
        self._repo_for_write(repo)
        body = self._json_body()
        if body.get("operation") != "upload" or "basic" not in body.get("transfers", ["basic"]):
            raise _HubError(400, "only the 'basic' upload transfer is implemented")
        objects = []
        for obj in body.get("objects", []):
            oid, size = obj["oid"], int(obj["size"])
            if not re.fullmatch(r"[0-9a-f]{64}", oid):
                objects.append({"oid": oid, "size": size, "error": {"code": 422, "message": "oid is not a sha256"}})
            elif oid in self.hub.lfs:
                objects.append({"oid": oid, "size": size})  # already stored: no actions, the client skips it
            else:
                objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                    "upload": {"href": f"{self.hub.cdn_url}/lfs-upload/{oid}/{size}", "expires_in": 3600},
                    "verify": {"href": f"{self.hub.url}/{repo}.git/info/lfs/objects/verify",
                               "header": {"Authorization": self.headers.get("Authorization", "")}},
                }})
        self._json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                   headers={"Content-Type": "application/vnd.git-lfs+json"})

    @_route("PUT", r"/lfs-upload/(?P<oid>[0-9a-f]{64})/(?P<size>[0-9]+)")
    def lfs_put(self, oid: str, size: str) -> None:  # lfs._upload_single_part (a presigned storage URL)
        data = self._body
        if len(data) != int(size):
            raise _HubError(400, f"size mismatch: the object is announced as {size} bytes, {len(data)} arrived")
        if hashlib.sha256(data).hexdigest() != oid:
            raise _HubError(400, "sha256 mismatch: the uploaded bytes do not hash to the announced oid")
        with self.hub._lock:
            self.hub.lfs[oid] = data
        self._send(200, b"")

    @_route("POST", rf"/{_REPO}\.git/info/lfs/objects/verify")
    def lfs_verify(self, repo: str) -> None:  # lfs.lfs_upload (verify action)
        body = self._json_body()
        data = self.hub.lfs.get(body.get("oid", ""))
        if data is None or len(data) != int(body.get("size", -1)):
            raise _HubError(404, "object not uploaded (or its size differs)")
        self._json({"success": True})

    @_route("POST", rf"/api/models/{_REPO}/commit/(?P<rev>[^/]+)")
    def commit(self, repo: str, rev: str) -> None:  # HfApi.create_commit
        r = self._repo_for_write(repo)
        branch = unquote(rev)
        lines = [json.loads(line) for line in self._body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise _HubError(400, "the commit payload must start with a header line")
        header = lines[0]["value"]
        create_pr = self._query.get("create_pr") == ["1"]
        with self.hub._lock:
            if branch not in r.branches:
                raise _HubError(404, f"Invalid rev id: {branch} (commits go to an existing branch)", "RevisionNotFound")
            head = r.branches[branch]
            parent = header.get("parentCommit")
            if parent is not None and parent != head:
                raise _HubError(412, f"A commit has happened since {parent}. The branch {branch} is now at {head}.")
            files = dict(r.commits[head].files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = value.get("path", "")
                if not path or path.startswith("/") or ".." in path.split("/"):
                    raise _HubError(400, f"invalid path in repo: {path!r}")
                if key == "file":
                    data = base64.b64decode(value["content"])
                    files[path] = _File(path, len(data), git_blob_sha1(data), data=data)
                elif key == "lfsFile":
                    oid, size = value["oid"], value.get("size")
                    if oid not in self.hub.lfs:
                        raise _HubError(400, f"{path}: LFS object {oid} was never uploaded")
                    if size is not None and int(size) != len(self.hub.lfs[oid]):
                        raise _HubError(400, f"{path}: size {size} differs from the uploaded object")
                    n = len(self.hub.lfs[oid])
                    files[path] = _File(path, n, git_blob_sha1(_lfs_pointer(oid, n)), sha256=oid)
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise _HubError(404, f"{path} does not exist", "EntryNotFound")
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    for p in [p for p in files if p.startswith(prefix)]:
                        del files[p]
                else:
                    raise _HubError(400, f"unsupported commit operation {key!r}")
            new = _Commit(self.hub._new_oid(repo, head), head, files, header.get("summary", ""), time.time())
            r.commits[new.oid] = new
            out: dict[str, Any] = {"commitOid": new.oid, "commitUrl": f"{self.hub.url}/{repo}/commit/{new.oid}"}
            if create_pr:
                num = len(r.pulls) + 1
                r.pulls[f"refs/pr/{num}"] = new.oid
                out["pullRequestUrl"] = f"{self.hub.url}/{repo}/discussions/{num}"
            else:
                r.branches[branch] = new.oid
        self._json(out)

    # download ---------------------------------------------------------------------------
    @_route("GET", rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<fpath>.+)")
    def resolve(self, repo: str, rev: str, fpath: str) -> None:  # file_download.get_hf_file_metadata / http_get
        r = self._repo_for_read(repo)
        oid = self.hub._resolve(r, rev)
        fpath = unquote(fpath)
        f = r.commits[oid].files.get(fpath)
        if f is None:
            self._error_commit = oid
            raise _HubError(404, f"Entry not found: {fpath}", "EntryNotFound")
        headers = {"X-Repo-Commit": oid, "Accept-Ranges": "bytes", **self.hub.etag_headers(f)}
        if f.sha256 is not None:  # LFS: the metadata is on the redirect; the bytes come from the "CDN"
            headers.update({"X-Linked-Size": str(f.size), "Location": f"{self.hub.cdn_url}/cdn-lfs/{f.sha256}?repo={repo}"})
            self._send(302, b"", headers)
            return
        self._send_content(f.data or b"", headers)

    @_route("GET", r"/cdn-lfs/(?P<sha>[0-9a-f]{64})")
    def cdn(self, sha: str) -> None:  # http_get after the redirect
        data = self.hub.lfs.get(sha)
        if data is None:
            raise _HubError(404, "no such object")
        self._send_content(data, {"ETag": f'"{sha}"'})

    def _send_content(self, data: bytes, headers: dict[str, str]) -> None:
        rng = self.headers.get("Range")
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
        if match:
            start = int(match.group(1))
            end = int(match.group(2)) if match.group(2) else len(data) - 1
            if start >= len(data):
                self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                return
            end = min(end, len(data) - 1)
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
            self._send(206, data[start : end + 1], headers)
            return
        self._send(200, data, headers)


def iter_routes() -> Iterator[tuple[str, str, str]]:
    """(method, path pattern, handler name) of every implemented route, for documentation."""
    for method, pattern, name in _ROUTES:
        yield method, pattern.pattern, name
