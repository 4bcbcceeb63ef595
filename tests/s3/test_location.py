"""Where an S3 store's settings come from: the environment first, then the AWS files,
then what `init` recorded; never the credentials from the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from casfs.errors import UsageError
from casfs.store.s3.location import Location, parse_url, read_location, resolve, write_location

AWS_VARS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "CASFS_BLOB_CACHE",
)


@pytest.fixture
def aws_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    (tmp_path / "config").write_text(
        "[default]\nregion = eu-west-1\n[profile lab]\nregion = lab-1\nendpoint_url = http://lab:8333\n"
    )
    (tmp_path / "credentials").write_text(
        "[default]\naws_access_key_id = K1\naws_secret_access_key = S1\n"
        "[lab]\naws_access_key_id = K2\naws_secret_access_key = S2\naws_session_token = T2\n"
    )
    return tmp_path


def test_urls() -> None:
    assert parse_url("s3://b") == Location("b", "")
    assert parse_url("s3://b/some/prefix/") == Location("b", "some/prefix")
    for bad in ("b/x", "s3://", "s3:///x", "s3://b/../x", "http://b"):
        with pytest.raises(UsageError):
            parse_url(bad)


def test_the_aws_files_then_the_environment(aws_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = Location("b", "p", "http://recorded:1", "rec-1")
    loc, creds = resolve(recorded)
    assert (loc.endpoint, loc.region, creds.key_id, creds.secret) == (
        "http://recorded:1",
        "eu-west-1",
        "K1",
        "S1",
    )
    monkeypatch.setenv("AWS_PROFILE", "lab")
    loc, creds = resolve(recorded)
    assert (loc.endpoint, loc.region) == ("http://lab:8333", "lab-1")
    assert (creds.key_id, creds.secret, creds.token) == ("K2", "S2", "T2")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:9/")
    monkeypatch.setenv("AWS_REGION", "env-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "K3")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "S3")
    monkeypatch.setenv("CASFS_BLOB_CACHE", "512M")
    loc, creds = resolve(recorded)
    assert (loc.endpoint, loc.region, loc.cache_bytes) == ("http://env:9", "env-1", 512 << 20)
    assert (creds.key_id, creds.secret, creds.token) == ("K3", "S3", None)


def test_the_store_records_where_not_who(aws_home: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    assert read_location(store) is None
    loc = Location("b", "p", "http://x:1", "r", 1 << 30, "abc")
    write_location(store, loc)
    assert read_location(store) == loc
    assert "K1" not in (store / "blobs.json").read_text()
