"""`casfs csi serve` refuses bad usage with one line and exit 2, and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import fails


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--node-id", "n"], "an endpoint is required"),
        (["--endpoint", "unix:///tmp/x.sock"], "a node id is required"),
        (["--endpoint", "tcp://127.0.0.1:9000", "--node-id", "n"], "expected unix:///PATH"),
        (
            ["--endpoint", "unix:///tmp/x.sock", "--node-id", "n", "--services", "node,frob"],
            "invalid --services",
        ),
        (["--endpoint", "unix:///tmp/x.sock", "--node-id", "n", "--log-level", "loud"], "invalid choice"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(store: Path, args: list[str], said: str) -> None:
    assert said in fails(store, 2, "csi", "serve", *args)


def test_a_file_at_the_socket_path_is_refused_and_kept(store: Path, tmp_path: Path) -> None:
    taken = tmp_path / "not-a-socket"
    taken.write_text("mine\n")
    assert "is not a socket" in fails(
        store, 2, "csi", "serve", "--endpoint", f"unix://{taken}", "--node-id", "n"
    )
    assert taken.read_text() == "mine\n"


def test_a_missing_store_is_not_found(tmp_path: Path) -> None:
    args = ["csi", "serve", "--endpoint", f"unix://{tmp_path}/s.sock", "--node-id", "n"]
    assert "no casfs store" in fails(tmp_path / "nothing", 3, *args)
