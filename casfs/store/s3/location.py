"""Where a store's blobs live in an object store, and the credentials to reach them.

`casfs init STORE --blobs s3://BUCKET[/PREFIX]` records the bucket and prefix (and the
endpoint and region in effect then, if any) in STORE/blobs.json: a small file beside the
catalog, read before anything else. The rest comes from where the AWS tools and restic
take it, the environment first:

    endpoint     AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, `endpoint_url` in the AWS config
                 file's profile, else the one recorded at init, else AWS itself
    region       AWS_REGION, AWS_DEFAULT_REGION, `region` in the profile, recorded, us-east-1
    credentials  AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else the
                 profile's in the shared credentials file (~/.aws/credentials, or
                 AWS_SHARED_CREDENTIALS_FILE; profile AWS_PROFILE or `default`)
    cache        the local cache of fetched blobs (diskcache): CASFS_BLOB_CACHE (bytes,
                 or with K/M/G/T), else `cache_bytes` in blobs.json (set by
                 `casfs init --blob-cache`), else DEFAULT_CACHE_BYTES; 0 turns it off

Credentials are never written to the store.
"""

from __future__ import annotations

import configparser
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from casfs.errors import UsageError

CONFIG_NAME = "blobs.json"
DEFAULT_REGION = "us-east-1"
DEFAULT_CACHE_BYTES = 4 << 30
ENV_CACHE = "CASFS_BLOB_CACHE"


@dataclass(frozen=True)
class Location:
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket's root
    endpoint: str = ""  # "" for AWS itself
    region: str = DEFAULT_REGION
    cache_bytes: int = DEFAULT_CACHE_BYTES
    store_id: str = ""  # the store that claimed the prefix (packfmt.CLAIM)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


@dataclass(frozen=True)
class Credentials:
    key_id: str | None
    secret: str | None
    token: str | None = None


def parse_url(url: str) -> Location:
    """s3://BUCKET[/PREFIX] -> a Location (endpoint and region not yet resolved)."""
    if not url.startswith("s3://"):
        raise UsageError(f"invalid blob location {url!r}: expected s3://BUCKET[/PREFIX]")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    prefix = prefix.strip("/")
    if not bucket or any(c in bucket for c in " \\?#") or ".." in prefix.split("/"):
        raise UsageError(f"invalid blob location {url!r}: expected s3://BUCKET[/PREFIX]")
    return Location(bucket, prefix)


def _profile() -> tuple[str, configparser.ConfigParser, configparser.ConfigParser]:
    name = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    home = Path.home() / ".aws"
    config = configparser.ConfigParser(interpolation=None)
    config.read(os.environ.get("AWS_CONFIG_FILE") or home / "config")
    creds = configparser.ConfigParser(interpolation=None)
    creds.read(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / "credentials")
    return name, config, creds


def _from_config(config: configparser.ConfigParser, profile: str, key: str) -> str | None:
    section = profile if profile == "default" else f"profile {profile}"
    return config.get(section, key, fallback=None) or None


def resolve(loc: Location) -> tuple[Location, Credentials]:
    """The location with its endpoint and region as the environment says now, and the
    credentials to use."""
    env = os.environ
    profile, config, creds_file = _profile()
    endpoint = (
        env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL")
        or _from_config(config, profile, "endpoint_url")
        or loc.endpoint
    )
    region = (
        env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION")
        or _from_config(config, profile, "region")
        or loc.region
        or DEFAULT_REGION
    )
    if env.get("AWS_ACCESS_KEY_ID"):
        creds = Credentials(
            env["AWS_ACCESS_KEY_ID"], env.get("AWS_SECRET_ACCESS_KEY"), env.get("AWS_SESSION_TOKEN")
        )
    else:
        get = creds_file.get
        creds = Credentials(
            get(profile, "aws_access_key_id", fallback=None),
            get(profile, "aws_secret_access_key", fallback=None),
            get(profile, "aws_session_token", fallback=None),
        )
    cache = env.get(ENV_CACHE)
    cache_bytes = parse_bytes(cache, f"${ENV_CACHE}") if cache and cache.strip() else loc.cache_bytes
    return Location(loc.bucket, loc.prefix, endpoint.rstrip("/"), region, cache_bytes, loc.store_id), creds


def parse_bytes(text: str, what: str) -> int:
    """'4G', '512M', '1048576' -> bytes (powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if t and t[-1] in "KMGT":
        scale = 1 << (10 * ("KMGT".index(t[-1]) + 1))
        t = t[:-1]
    if not t.isdigit():
        raise UsageError(f"invalid {what} {text!r}: expected a size such as 4G or 512M")
    return int(t) * scale


def read_location(store: Path) -> Location | None:
    """The blob location recorded in STORE, or None: the store keeps its blobs itself."""
    try:
        data = json.loads((store / CONFIG_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UsageError(f"{store / CONFIG_NAME} is unreadable: {e}") from None
    return Location(**{f.name: data[f.name] for f in fields(Location) if f.name in data})


def write_location(store: Path, loc: Location) -> None:
    tmp = store / f"{CONFIG_NAME}.tmp"
    tmp.write_text(json.dumps({"url": loc.url, **asdict(loc)}, indent=2) + "\n")
    os.replace(tmp, store / CONFIG_NAME)
