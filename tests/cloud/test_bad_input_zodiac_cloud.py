"""Bad input to ``zodiac-cloud``: every case is a non-zero exit with one clear line naming the
problem, never a traceback (an exception escaping ``main`` is one). The materialise cases run
Spark in local mode (the shared session); the publisher cases fail before any broker is used."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.protocol.keys import generate_key_pair
from cloud.zodiac_cloud_cli import main

XSD_DOUBLE = "<http://www.w3.org/2001/XMLSchema#double>"
RULES = "r: <q>(X, Y) :- <p>(X, Y) .\n"


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# (id, files, argv with {d} for the folder, what the message names)
MATERIALISE = [
    ("rules-missing", {}, ["--rules", "{d}/none.rules"], "none.rules"),
    ("rules-is-directory", {"dir/x": ""}, ["--rules", "{d}/dir"], "dir"),
    ("rules-syntax", {"r.rules": "r: <q>(X :- .\n"}, ["--rules", "{d}/r.rules"], "r.rules:1:"),
    ("unsafe-rule", {"r.rules": "<q>(X, Z) :- <p>(X, Y) .\n"}, ["--rules", "{d}/r.rules"], "Z"),
    (
        "unstratifiable",
        {"r.rules": "<q>(X) :- <p>(X, Y) and not <s>(X) .\n<s>(X) :- <q>(X) .\n"},
        ["--rules", "{d}/r.rules"],
        "not stratifiable",
    ),
    (
        "nan-literal",
        {"r.rules": f'<q>(X) :- <p>(X, Y) and COMP(Y, <, "NaN"^^{XSD_DOUBLE}) .\n'},
        ["--rules", "{d}/r.rules"],
        "finite",
    ),
    (
        "deep-expression",
        {"r.rules": "<q>(Y) :- <p>(X) and bind(" + "(" * 500 + "X" + ")" * 500 + " as Y) .\n"},
        ["--rules", "{d}/r.rules"],
        "nested",
    ),
    (
        "facts-missing",
        {"r.rules": RULES},
        ["--rules", "{d}/r.rules", "--facts", "{d}/no.nt"],
        "no.nt",
    ),
    (
        "facts-inf",
        {"r.rules": RULES, "f.nt": f'<a> <p> "INF"^^{XSD_DOUBLE} .\n'},
        ["--rules", "{d}/r.rules", "--facts", "{d}/f.nt"],
        "finite",
    ),
    (
        "facts-syntax",
        {"r.rules": RULES, "f.nt": "<a> <p> .\n"},
        ["--rules", "{d}/r.rules", "--facts", "{d}/f.nt"],
        "f.nt",
    ),
    (
        "parquet-dir-without-manifest",
        {"r.rules": RULES, "pq/x": ""},
        ["--rules", "{d}/r.rules", "--facts", "{d}/pq"],
        "manifest",
    ),
    (
        "out-under-a-file",
        {"r.rules": RULES, "file": "x"},
        ["--rules", "{d}/r.rules", "--out", "{d}/file/out"],
        "file",
    ),
]


@pytest.mark.parametrize(
    ("files", "argv", "names"), [c[1:] for c in MATERIALISE], ids=[c[0] for c in MATERIALISE]
)
def test_materialise_refuses_bad_input_in_one_line(tmp_path, capsys, spark, files, argv, names):
    write(tmp_path, files)
    args = [a.format(d=tmp_path) for a in argv]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    code = main(["materialise", "--quiet", *args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and lines[0].startswith("zodiac-cloud: "), err
    assert names in lines[0], err
    assert "Traceback" not in err


# The cases found in the input itself: said before Spark starts (which takes seconds), and
# before --out is made.
BEFORE_SPARK = ["rules-missing", "rules-syntax", "unsafe-rule", "unstratifiable", "facts-missing"]


@pytest.mark.parametrize("case", BEFORE_SPARK)
def test_materialise_checks_its_input_before_starting_spark(tmp_path, capsys, monkeypatch, case):
    from cloud.spark import session

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark started for input that could be refused before")

    monkeypatch.setattr(session, "local_session", no_spark)
    _, files, argv, names = next(c for c in MATERIALISE if c[0] == case)
    write(tmp_path, files)
    out = tmp_path / "out"
    args = [a.format(d=tmp_path) for a in argv]
    code = main(["materialise", "--quiet", *args, "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and names in err and "Traceback" not in err, err
    assert not out.exists()


def publisher_args(folder: Path, **change: str) -> list[str]:
    (folder / "streams").mkdir(exist_ok=True)
    (folder / "streams" / "base.rules").write_text(RULES)
    private, _ = generate_key_pair(folder / "keys", "cloud-1")
    args = {
        "--farm": "farm1",
        "--rules-dir": str(folder / "streams"),
        "--key": str(private),
        "--state": str(folder / "cloud.db"),
    }
    args.update(change)
    return [part for pair in args.items() for part in pair]


PUBLISH = [
    ("key-missing", lambda d: {"--key": str(d / "none.pem")}, "none.pem"),
    (
        "key-garbage",
        lambda d: (d / "bad.pem").write_text("garbage") and {"--key": str(d / "bad.pem")},
        "bad.pem",
    ),
    ("rules-dir-missing", lambda d: {"--rules-dir": str(d / "nothing")}, "nothing"),
    ("state-is-directory", lambda d: (d / "sdir").mkdir() or {"--state": str(d / "sdir")}, "sdir"),
]


@pytest.mark.parametrize(("change", "names"), [c[1:] for c in PUBLISH], ids=[c[0] for c in PUBLISH])
def test_publish_refuses_bad_input_in_one_line(tmp_path, capsys, change, names):
    args = publisher_args(tmp_path, **change(tmp_path))
    code = main(["publish", *args, "--devices", "t1", "--broker", "127.0.0.1:1"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and lines and lines[-1].startswith("zodiac-cloud: "), err
    assert names in err and "Traceback" not in err


@pytest.mark.parametrize("ttl", ["0", "-5", "abc", "nan", "inf", "1e308", "40000000"])
def test_a_bad_bundle_ttl_is_a_usage_error(tmp_path, capsys, ttl):
    with pytest.raises(SystemExit) as exit_:
        main(["publish", *publisher_args(tmp_path), "--devices", "t1", "--bundle-ttl", ttl])
    assert exit_.value.code == 2 and "--bundle-ttl" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "abc", "1.5"])
def test_a_bad_local_below_is_a_usage_error(tmp_path, capsys, value):
    write(tmp_path, {"r.rules": RULES})
    argv = ["materialise", "--rules", str(tmp_path / "r.rules"), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--local-below", value])
    assert exit_.value.code == 2 and "--local-below" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_serve_refuses_an_event_answered_by_no_stream(tmp_path, capsys):
    args = publisher_args(tmp_path)
    code = main(["serve", *args, "--broker", "127.0.0.1:1", "--answer", "hot=anomaly/nosuch"])
    err = capsys.readouterr().err
    assert code == 1 and err.strip().splitlines() == [
        f"zodiac-cloud: event 'hot' is answered by stream 'anomaly/nosuch': no such stream "
        f"under {tmp_path / 'streams'}"
    ]
    assert not (tmp_path / "cloud.db").exists()  # nothing made


@pytest.mark.parametrize("answer", ["", "=base", "hot="])
def test_a_malformed_answer_is_a_usage_error(tmp_path, capsys, answer):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *publisher_args(tmp_path), "--answer", answer])
    assert exit_.value.code == 2 and "--answer" in capsys.readouterr().err
