"""Downloads that resume (a dropped connection must not restart a large download), against a real HTTP
server on 127.0.0.1 that misbehaves on purpose: it drops the connection mid-body, ignores a Range request
once, answers 503 or 403, or sends corrupted bytes."""
from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from bench_cli.core.errors import DataNotFoundError
from attnbench.tasks.data import download

PAYLOAD = bytes(range(256)) * 1200  # 307,200 bytes: several 1 MB-or-less reads, a drop midway
SHA256 = hashlib.sha256(PAYLOAD).hexdigest()
MD5 = hashlib.md5(PAYLOAD).hexdigest()


class Server:
    """``script``: what each successive GET does: 'drop' (half the body, then the connection
    closes), 'ignore-range' (the whole file with 200 whatever the Range), 'ok' (honours Range),
    '503', '403', 'corrupt' (one byte changed). The last entry repeats. ``requests``: the Range
    header of each GET (None without one)."""

    def __init__(self, script: list[str], etag: str | None = None, port: int = 0):
        self.script, self.requests, self.if_ranges = list(script), [], []
        self.etag = etag  # the file's version: sent with it, and an If-Range naming another is not honoured
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                action = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                wanted = self.headers.get("Range")
                outer.requests.append(wanted)
                outer.if_ranges.append(self.headers.get("If-Range"))
                if action in ("503", "403"):
                    self.send_error(int(action))
                    return
                if action.startswith("416"):  # 'range not satisfiable', with the size after the slash or none
                    self.send_response(416)
                    if action != "416":
                        self.send_header("Content-Range", f"bytes */{action[4:]}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = PAYLOAD if action != "corrupt" else PAYLOAD[:1000] + b"\0" + PAYLOAD[1001:]
                honours = action == "ok" and self.headers.get("If-Range") in (None, outer.etag)
                start = int(wanted[6:].split("-")[0]) if wanted and honours else 0
                self.send_response(206 if start else 200)
                if outer.etag:
                    self.send_header("ETag", outer.etag)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if action == "drop":
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body[start:])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/file.bin"
        # shutdown() waits for the serving loop to look again: every 10 ms, not its default 0.5 s
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def fetch(server: Server, target: Path, **kw) -> str:
    return download(server.url, target, what="the test file", where=str(target), timeout=10, backoff_s=0, **kw)


def test_a_dropped_connection_resumes_with_a_range_request(tmp_path):
    target = tmp_path / "file.bin"
    with Server(["drop", "ok"]) as s:
        digest = fetch(s, target, sha256=SHA256)
    assert target.read_bytes() == PAYLOAD and digest == SHA256
    assert s.requests == [None, f"bytes={len(PAYLOAD) // 2}-"]  # the second asked only for the rest
    assert not (tmp_path / "file.bin.part").exists()
    assert (tmp_path / "file.bin.sha256").read_text() == f"{SHA256}  file.bin\n"


def test_a_server_that_ignores_range_once_sends_the_whole_file_again(tmp_path):
    target = tmp_path / "file.bin"
    with Server(["drop", "ignore-range", "ok"]) as s:
        fetch(s, target, md5=MD5)
    assert target.read_bytes() == PAYLOAD  # not the first half twice
    assert s.requests == [None, f"bytes={len(PAYLOAD) // 2}-"]


def test_a_partial_file_left_by_an_earlier_command_is_resumed(tmp_path):
    target = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes(PAYLOAD[:100_000])
    with Server(["ok"]) as s:
        fetch(s, target, sha256=SHA256)
    assert target.read_bytes() == PAYLOAD and s.requests == ["bytes=100000-"]


def test_a_busy_server_is_retried(tmp_path):
    target = tmp_path / "file.bin"
    with Server(["503", "503", "ok"]) as s:
        fetch(s, target)
    assert target.read_bytes() == PAYLOAD and len(s.requests) == 3


def test_a_corrupted_download_is_refused_and_removed(tmp_path):
    target = tmp_path / "file.bin"
    with Server(["corrupt"]) as s, pytest.raises(DataNotFoundError, match="corrupt download .*sha256 differs"):
        fetch(s, target, sha256=SHA256)
    assert not target.exists() and not (tmp_path / "file.bin.part").exists()


def test_a_refusal_is_one_line_saying_what_to_do_and_is_not_retried(tmp_path):
    target = tmp_path / "file.bin"
    with Server(["403"]) as s, pytest.raises(DataNotFoundError) as e:
        fetch(s, target)
    assert len(s.requests) == 1
    message = str(e.value)
    assert "\n" not in message and "refused" in message and "HTTP 403" in message
    assert f"fetch it by hand and put it so that {target} exists" in message


def test_giving_up_keeps_the_part_for_the_next_command(tmp_path):
    target = tmp_path / "file.bin"
    with Server(["drop"]) as s, pytest.raises(DataNotFoundError, match="after 2 attempts .*run the command again"):
        fetch(s, target, attempts=2)
    assert (tmp_path / "file.bin.part").stat().st_size == len(PAYLOAD) // 2
    with Server(["ok"]) as s:
        fetch(s, target, sha256=SHA256)  # the next command asks for the rest only
    assert target.read_bytes() == PAYLOAD and s.requests == [f"bytes={len(PAYLOAD) // 2}-"]


# --- a partial file that cannot be told to be of the same file is never spliced -------------------
def test_a_stale_part_without_checksum_or_validator_is_fetched_again_not_spliced(tmp_path, capsys):
    """An earlier command's .part of an older version of the file, a server that honours Range, no
    checksum: resuming would splice the old head onto the new tail (and the sizes would agree)."""
    target = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes(b"old version " * 10_000)
    with Server(["ok"]) as s:
        fetch(s, target)
    assert target.read_bytes() == PAYLOAD and s.requests == [None]
    assert "discarding" in capsys.readouterr().err


def test_a_part_with_the_servers_validator_resumes_only_while_the_file_is_the_same(tmp_path):
    target = tmp_path / "file.bin"
    with Server(["drop"], etag='"v2"') as s, pytest.raises(DataNotFoundError):
        fetch(s, target, attempts=1)
    assert (tmp_path / "file.bin.part.validator").is_file()  # the server's ETag, kept beside the part
    port = s.httpd.server_address[1]  # the same URL: a validator is kept for its URL only
    with Server(["ok"], etag='"v2"', port=port) as s:  # the next command: Range with If-Range, the same version
        fetch(s, target)
    assert target.read_bytes() == PAYLOAD and s.requests == [f"bytes={len(PAYLOAD) // 2}-"] and s.if_ranges == ['"v2"']
    assert not (tmp_path / "file.bin.part.validator").exists()

    target.unlink()
    with Server(["drop"], etag='"v1"', port=port) as s, pytest.raises(DataNotFoundError):
        fetch(s, target, attempts=1)
    with Server(["ok"], etag='"v2"', port=port) as s:  # the file changed since: the server sends all of it
        fetch(s, target)
    assert target.read_bytes() == PAYLOAD and s.if_ranges == ['"v1"']


@pytest.mark.parametrize("answer", ["416", f"416/{len(PAYLOAD)}"])
def test_a_416_for_an_oversized_part_is_fetched_again_never_moved_into_place(tmp_path, answer):
    target = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes(PAYLOAD + b"extra bytes of something else")
    with Server([answer, "ok"]) as s:
        fetch(s, target, md5=MD5)  # trusted to resume: the server's 416 decides
    assert target.read_bytes() == PAYLOAD and s.requests == [f"bytes={len(PAYLOAD) + 29}-", None]


def test_a_416_with_the_parts_own_size_is_the_whole_file(tmp_path):
    target = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes(PAYLOAD)
    with Server([f"416/{len(PAYLOAD)}"]) as s:
        fetch(s, target, sha256=SHA256)
    assert target.read_bytes() == PAYLOAD and len(s.requests) == 1
