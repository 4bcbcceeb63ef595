"""The bucket, as casfs uses it: a thin layer over obstore's sync API that turns its
errors into casfs's. Every call blocks (a worker thread's job: obstore releases the GIL
for the whole request).

    FileNotFoundError   the object (or range) is not there: a 404
    RemoteError         anything else (unreachable, refused, 5xx after obstore's retries):
                        an OSError with errno EIO, so a mount answers EIO, and a message
                        naming the endpoint, the bucket and what was being done

obstore retries 5xx, timeouts and dropped connections with exponential backoff; the
RETRY settings below bound how long a call may take in all (RETRY_TIMEOUT): a read of
data the object store cannot give fails with EIO in bounded time, never hangs.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from casfs.store.s3.location import Credentials, Location

if TYPE_CHECKING:
    from obstore.store import S3Store

CONNECT_TIMEOUT = timedelta(seconds=3)
REQUEST_TIMEOUT = timedelta(seconds=30)
RETRY_TIMEOUT = timedelta(seconds=10)
MAX_RETRIES = 4


class RemoteError(OSError):
    """The object store failed a request (after retries). `code` is its error code (S3's
    `<Code>`, such as NoSuchBucket or SignatureDoesNotMatch) or the HTTP status, or
    "unreachable"."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(errno.EIO, message)
        self.code = code

    def __str__(self) -> str:
        return str(self.strerror)


def _code(e: BaseException) -> tuple[str, str]:
    """(code, a short reason) from obstore's multi-line message."""
    text = str(e)
    s3_code = re.search(r"<Code>(\w+)</Code>", text)
    status = re.search(r"status code: (\d{3}[^:<]*)", text)
    if s3_code:
        return s3_code.group(1), f"{status.group(1).strip() if status else ''} {s3_code.group(1)}".strip()
    if status:
        return status.group(1).split()[0], status.group(1).strip()
    if "error sending request" in text or "connect" in text.lower() or "timed out" in text.lower():
        return "unreachable", "cannot connect"
    return "error", text.splitlines()[0][:200] if text else type(e).__name__


class Remote:
    def __init__(self, loc: Location, creds: Credentials) -> None:
        from obstore.store import S3Store

        self.loc = loc
        self.where = f"s3://{loc.bucket}/{loc.prefix} at {loc.endpoint or 'AWS'}"
        options: dict[str, object] = {"connect_timeout": CONNECT_TIMEOUT, "timeout": REQUEST_TIMEOUT}
        if loc.endpoint.startswith("http://"):
            options["allow_http"] = True
        given = {"endpoint": loc.endpoint, "access_key_id": creds.key_id, "secret_access_key": creds.secret}
        if creds.token:
            given["token"] = creds.token
        self.store: S3Store = S3Store(
            loc.bucket,
            prefix=loc.prefix or None,
            config={k: v for k, v in given.items() if v},  # type: ignore[arg-type]
            region=loc.region,
            # AWS itself: bucket.s3.region.amazonaws.com; another server: its /bucket path.
            virtual_hosted_style_request=not loc.endpoint,
            client_options=options,  # type: ignore[arg-type]
            retry_config={
                "max_retries": MAX_RETRIES,
                "retry_timeout": RETRY_TIMEOUT,
                "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2)},
            },
        )

    def error(self, what: str, e: BaseException) -> RemoteError:
        code, reason = _code(e)
        return RemoteError(f"{what}: {self.where}: {reason}", code)

    def put_new(self, key: str, data: bytes | memoryview) -> bool:
        """Create `key` unless it exists (If-None-Match: *): True if this call made it,
        False if it was there already (never overwritten)."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            obstore.put(self.store, key, data, mode="create", use_multipart=False)
        except (AlreadyExistsError, PreconditionError):
            return False
        except Exception as e:
            raise self.error(f"cannot write {key}", e) from None
        return True

    def get(self, key: str, start: int | None = None, length: int | None = None) -> bytes:
        import obstore

        try:
            if length == 0:
                return b""  # (an index naming an empty blob: corrupt, the caller's check says)
            if start is None:
                return bytes(obstore.get(self.store, key).bytes())
            return bytes(obstore.get_range(self.store, key, start=start, length=length))
        except FileNotFoundError:
            raise
        except Exception as e:
            if _code(e)[0] in ("NoSuchKey", "404", "InvalidRange", "416"):
                raise FileNotFoundError(errno.ENOENT, f"{key} not found in {self.where}") from None
            raise self.error(f"cannot read {key}", e) from None

    def exists(self, key: str) -> bool:
        import obstore

        try:
            obstore.head(self.store, key)
        except FileNotFoundError:
            return False
        except Exception as e:
            raise self.error(f"cannot look up {key}", e) from None
        return True

    def delete(self, keys: list[str]) -> None:
        """Remove objects; absent ones are not an error."""
        import obstore

        for i in range(0, len(keys), 1000):
            try:
                obstore.delete(self.store, keys[i : i + 1000])
            except FileNotFoundError:
                pass
            except Exception as e:
                raise self.error(f"cannot delete {keys[i]}", e) from None

    def list_dated(self, prefix: str) -> Iterator[tuple[str, float]]:
        """(key, last modified as a unix time) of every object under `prefix`."""
        import obstore

        try:
            for page in obstore.list(self.store, prefix=prefix, chunk_size=1000):
                for meta in page:
                    yield meta["path"], meta["last_modified"].timestamp()
        except Exception as e:
            raise self.error(f"cannot list {prefix}", e) from None

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under `prefix`."""
        import obstore

        try:
            for page in obstore.list(self.store, prefix=prefix, chunk_size=1000):
                for meta in page:
                    yield meta["path"], meta["size"]
        except Exception as e:
            raise self.error(f"cannot list {prefix}", e) from None
