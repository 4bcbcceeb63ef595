"""A read-only OCI registry over an OCI layout, for `ctr images pull --plain-http`
offline: the distribution API's GET/HEAD of /v2/, of a repository's manifests (by tag,
the layout's ref.name annotation, or by digest) and of its blobs. Every repository name
serves the same layout. Counts the blobs sent, so a test sees what a pull fetched."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class Registry:
    def __init__(self, layout: Path) -> None:
        self.layout = layout
        self.sent: Counter[str] = Counter()  # digest -> GETs of that blob
        self.address = ""

    def tags(self) -> dict[str, dict[str, Any]]:
        index = json.loads((self.layout / "index.json").read_text())
        return {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in index["manifests"]}

    def blob(self, digest: str) -> Path | None:
        algo, _, hexa = digest.partition(":")
        path = self.layout / "blobs" / algo / hexa
        return path if algo == "sha256" and hexa.isalnum() and path.is_file() else None


def _handler(reg: Registry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts == ["v2"]:
                return self._send(200, b"{}", "application/json", None, body)
            if len(parts) < 4 or parts[0] != "v2" or parts[-2] not in ("manifests", "blobs"):
                return self._send(404, b"", "text/plain", None, body)
            what, ref = parts[-2], parts[-1]
            media = "application/octet-stream"
            if what == "manifests":
                desc = reg.tags().get(ref)
                digest = desc["digest"] if desc else ref
                media = desc["mediaType"] if desc else "application/vnd.oci.image.manifest.v1+json"
            else:
                digest = ref
            path = reg.blob(digest)
            if path is None:
                return self._send(404, b"", "text/plain", None, body)
            if what == "blobs" and body:
                reg.sent[digest] += 1
            self._send(200, path.read_bytes(), media, digest, body)

        def _send(self, code: int, data: bytes, media: str, digest: str | None, body: bool) -> None:
            self.send_response(code)
            self.send_header("Content-Type", media)
            self.send_header("Content-Length", str(len(data)))
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler


@contextmanager
def serving(layout: Path) -> Iterator[Registry]:
    """The registry on 127.0.0.1 (a free port) until the block ends; .address is HOST:PORT."""
    reg = Registry(layout)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(reg))
    reg.address = f"127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield reg
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
