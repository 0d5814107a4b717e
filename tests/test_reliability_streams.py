"""Inputs that are pipes, or built to exhaust the process (issue 45, items 8 and 11): ``credit`` on a
pipe, a FIFO or standard input gives what it gives on the file; a line longer than the limit (a gzip
bomb), JSON or TOML nested too deep, are one line each, exit 2."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from milegpo_cli.credit import Rollout
from milegpo_cli.interchange import MAX_LINE_BYTES, write_rollouts

SCRIPT = Path(sys.executable).with_name("milegpo")
ROLLOUTS = [Rollout("g", str(i), ["s0", "s1", "s2"], ["a", "b" if i % 2 else "c", "d"], [0, 0, float(i % 2)],
                    float(i % 2)) for i in range(6)]


def milegpo(*args: str, stdin=None, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], input=stdin, capture_output=True, timeout=timeout, cwd=cwd)


def one_error_line(res: subprocess.CompletedProcess) -> str:
    err = res.stderr.decode()
    assert res.returncode == 2, (res.returncode, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.fixture()
def rollouts(tmp_path) -> tuple[Path, bytes]:
    """A rollouts file and the credit output of that file."""
    src = tmp_path / "r.jsonl"
    write_rollouts(src, ROLLOUTS)
    res = milegpo("credit", str(src), "-o", str(tmp_path / "file.jsonl"))
    assert res.returncode == 0, res.stderr
    expected = (tmp_path / "file.jsonl").read_bytes()
    assert expected.count(b"\n") == 18
    return src, expected


@pytest.mark.parametrize("gzipped", [False, True])
def test_credit_on_standard_input_equals_credit_on_the_file(tmp_path, rollouts, gzipped):
    src, expected = rollouts
    data = gzip.compress(src.read_bytes()) if gzipped else src.read_bytes()
    for args in (["-"], ["--input", "-"]):
        res = milegpo("credit", *args, "-o", str(tmp_path / "stdin.jsonl"), stdin=data)
        assert res.returncode == 0, res.stderr
        assert (tmp_path / "stdin.jsonl").read_bytes() == expected


def test_credit_on_a_pipe_equals_credit_on_the_file(tmp_path, rollouts):
    """A FIFO (what ``<(cat r.jsonl)`` and ``/dev/stdin`` are) is read once: the input is not lost."""
    src, expected = rollouts
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(src.read_bytes()))
    writer.start()
    res = milegpo("credit", str(fifo), "-o", str(tmp_path / "pipe.jsonl"))
    writer.join(timeout=30)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "pipe.jsonl").read_bytes() == expected
    res = milegpo("credit", "/dev/stdin", "-o", str(tmp_path / "devstdin.jsonl"), stdin=src.read_bytes())
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "devstdin.jsonl").read_bytes() == expected


def test_credit_on_a_missing_input_or_a_folder_is_one_line(tmp_path):
    assert "input nope.jsonl: cannot be read (No such file or directory)" in one_error_line(
        milegpo("credit", "nope.jsonl", "-o", str(tmp_path / "o.jsonl"), cwd=tmp_path))
    assert "cannot be read (Is a directory)" in one_error_line(milegpo("credit", str(tmp_path), "-o", "o.jsonl",
                                                                       cwd=tmp_path))


def test_a_gzip_bomb_stops_at_the_line_limit(tmp_path):
    """1 GiB of zeros without a newline in a 1 MB gzip file: refused once the limit is read (it took
    1:42 and 2.4 GB of memory before), nothing written."""
    bomb = tmp_path / "bomb.jsonl.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(bomb, "wb") as f:
        for _ in range(1024):
            f.write(packer.compress(bytes(2**20)))
        f.write(packer.flush())
    start = time.monotonic()
    res = milegpo("credit", str(bomb), "-o", str(tmp_path / "o.jsonl"))
    line = one_error_line(res)
    assert line == f"error: line 1, field '<line>': longer than {MAX_LINE_BYTES // 2**20} MiB", line
    assert time.monotonic() - start < 60
    assert not (tmp_path / "o.jsonl").exists()


def test_a_plain_line_over_the_limit_is_one_line(tmp_path):
    src = tmp_path / "long.jsonl"
    src.write_bytes(json.dumps({"group": "g", "rollout": 0, "outcome": 0, "steps": []}).encode() + b"\n"
                    + b" " * (MAX_LINE_BYTES + 1) + b"\n")
    assert one_error_line(milegpo("credit", str(src), "-o", str(tmp_path / "o.jsonl"))) == \
        f"error: line 2, field '<line>': longer than {MAX_LINE_BYTES // 2**20} MiB"


def test_deeply_nested_json_and_json_messages_are_one_line(tmp_path):
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"group": "g", "rollout": 0, "outcome": 0, "steps": [], "x": ' + "[" * 5000 + "]" * 5000 + "}\n")
    assert one_error_line(milegpo("credit", str(deep), "-o", str(tmp_path / "o.jsonl"))) == \
        "error: line 1, field '<json>': nested too deep"
    ctl = tmp_path / "ctl.jsonl"
    ctl.write_bytes(b'{"group": "g\x01", "rollout": 0, "outcome": 0, "steps": []}\n')
    assert one_error_line(milegpo("credit", str(ctl), "-o", str(tmp_path / "o.jsonl"))) == \
        "error: line 1, field '<json>': invalid JSON (Invalid control character at column 13)"
