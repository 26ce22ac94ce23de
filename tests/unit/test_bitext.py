"""Parallel text from packages (vepo_mcore/bitext): each format's reader on small fixtures (the gettext
reader against Python's own on a real catalog), the .deb reader, the filters and a whole build on
fixture packages, and the errors a user sees when the package client is missing."""

from __future__ import annotations

import gettext
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from vepo_mcore.bitext.build import BitextPlan, build_parallel_corpus, drop_reason
from vepo_mcore.bitext.debs import deb_members, fetch_debs
from vepo_mcore.bitext.formats import (
    clean_text,
    read_cldr,
    read_fluent,
    read_help_html,
    read_mo,
    read_po,
    read_properties,
)
from vepo_mcore.bitext.sources import SOURCES, register_source, source

ROOT = Path(__file__).resolve().parents[2]


def write_mo(catalog: dict[str, str]) -> bytes:
    """A little-endian gettext .mo file of `catalog` (the layout GNU msgfmt writes)."""
    keys = sorted(catalog)
    ids = [k.encode() for k in keys]
    strs = [catalog[k].encode() for k in keys]
    header = 7 * 4
    table = header + 16 * len(keys)
    blob, offsets = b"", []
    for s in ids + strs:
        offsets.append((len(s), table + len(blob)))
        blob += s + b"\0"
    out = struct.pack("<7I", 0x950412DE, 0, len(keys), header, header + 8 * len(keys), 0, 0)
    for length, at in offsets:
        out += struct.pack("<2I", length, at)
    return out + blob


def test_read_mo_reads_what_msgfmt_writes_and_skips_the_header():
    data = write_mo({"": "Content-Type: text/plain; charset=UTF-8\n", "Open": "Mở", "menu\x04Save": "Lưu"})
    assert read_mo(data) == {"Open": "Mở", "menu\x04Save": "Lưu"}
    with pytest.raises(ValueError, match="not a gettext .mo file"):
        read_mo(b"\0" * 40, "bad.mo")


def test_read_mo_agrees_with_pythons_gettext_on_a_real_catalog():
    catalogs = sorted(Path("/usr/share/locale").glob("*/LC_MESSAGES/*.mo"))
    assert catalogs, "the machine has gettext catalogs in /usr/share/locale"
    path = max(catalogs[:40], key=lambda p: p.stat().st_size)
    ours = read_mo(path.read_bytes(), str(path))
    theirs = gettext.GNUTranslations(path.open("rb"))._catalog  # the reference parser's table
    singular = {
        (k if isinstance(k, str) else k[0]): v
        for k, v in theirs.items()
        if (isinstance(k, str) or k[1] == 0) and k not in ("", ("", 0)) and v
    }
    assert ours == singular and len(ours) > 10


def test_read_po_contexts_plurals_escapes_and_fuzzy():
    po = r"""
msgid ""
msgstr "Content-Type: text/plain; charset=UTF-8\n"

#: src/main.c:10
msgid "Open a \"file\""
msgstr "Mở một \"tệp\""

msgctxt "menu"
msgid "Save"
msgstr ""
"Lưu "
"lại"

#, fuzzy
msgid "Quit"
msgstr "Thoát"

msgid "%d file"
msgid_plural "%d files"
msgstr[0] "%d tệp"
"""
    assert read_po(po) == {'Open a "file"': 'Mở một "tệp"', "menu\x04Save": "Lưu lại", "%d file": "%d tệp"}
    with pytest.raises(ValueError, match="x.po: not a .po line"):
        read_po('msgid "a"\nmsgstr "b"\nnonsense', "x.po")


def test_read_fluent_messages_attributes_multiline_and_selectors():
    ftl = """# comment
-brand-name = Firefox
about = About { -brand-name }
    .accesskey = A
long-text =
    First line
    second line.
count = { $n ->
    [one] One tab
   *[other] { $n } tabs
}
after = Still read
"""
    assert read_fluent(ftl) == {
        "-brand-name": "Firefox",
        "about": "About { -brand-name }",
        "about.accesskey": "A",
        "long-text": "First line second line.",
        "after": "Still read",
    }


def test_read_properties():
    text = "# c\n! c\nok = OK\nwrapped = one \\\n    two\nescaped=caf\\u00e9\nno_separator\n"
    assert read_properties(text) == {"ok": "OK", "wrapped": "one two", "escaped": "café"}


def test_read_help_html_ids_visible_text_only():
    page = """<html><body><h1 id="hd_1">Load/Save <b>options</b></h1>
<p id="par_1" class="paragraph">Choose <span hidden="true">MAC menu</span><span>Tools - Options</span>.</p>
<div><p id="par_2">Second<br>paragraph</p><p>no id</p></div></body></html>"""
    assert read_help_html(page) == {
        "hd_1": "Load/Save options",
        "par_1": "Choose Tools - Options.",
        "par_2": "Secondparagraph",
    }


def test_read_cldr_paths_tell_siblings_apart():
    xml = b"""<?xml version="1.0" encoding="UTF-8" ?>
<ldml><localeDisplayNames><languages>
<language type="th">Thai</language><language type="vi">Vietnamese</language>
<language type="vi" alt="short">Viet</language></languages></localeDisplayNames>
<annotations><annotation cp="\xf0\x9f\x98\x80" type="tts">grinning face</annotation></annotations></ldml>"""
    got = read_cldr(xml)
    assert got["/ldml/localeDisplayNames/languages/language[type=th]"] == "Thai"
    assert got["/ldml/localeDisplayNames/languages/language[type=vi,alt=short]"] == "Viet"
    assert got["/ldml/annotations/annotation[type=tts,cp=\U0001f600]"] == "grinning face"
    with pytest.raises(ValueError, match="bad.xml: not well-formed XML"):
        read_cldr(b"<ldml>", "bad.xml")


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("~Open File...", "Open File..."),
        ("_Save as", "Save as"),
        ("&Print", "Print"),
        ("Find & Replace", "Find & Replace"),
        ("打开(_O)", "打开"),
        ("<b>Bold</b> text", "Bold text"),
        ("Delete { $count } items from %s  in\n2024", "Delete { $count } items from %s in 2024"),
        ("From_currency", "From_currency"),
        ("Tom &amp; Jerry", "Tom & Jerry"),
    ],
)
def test_clean_text_strips_markup_and_access_keys_keeps_placeables(raw, clean):
    assert clean_text(raw) == clean


def _tar_xz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_deb(path: Path, files: dict[str, bytes]) -> Path:
    """A minimal binary .deb (ar archive: debian-binary, control.tar.xz, data.tar.xz)."""
    members = [("debian-binary", b"2.0\n"), ("control.tar.xz", _tar_xz({})), ("data.tar.xz", _tar_xz(files))]
    out = b"!<arch>\n"
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode() + data
        out += b"\n" if len(data) % 2 else b""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out)
    return path


def test_deb_members_reads_the_data_archive(tmp_path):
    deb = write_deb(tmp_path / "x_1.0_all.deb", {"usr/share/a.mo": b"A", "usr/share/b.txt": b"odd"})
    assert dict(deb_members(deb, suffixes=(".mo",))) == {"usr/share/a.mo": b"A"}
    assert dict(deb_members(deb)) == {"usr/share/a.mo": b"A", "usr/share/b.txt": b"odd"}
    (tmp_path / "y_1_all.deb").write_bytes(b"not an archive")
    with pytest.raises(ValueError, match="y_1_all.deb: not a .deb"):
        list(deb_members(tmp_path / "y_1_all.deb"))


def test_fetch_debs_uses_the_cache_and_names_a_missing_client(tmp_path, monkeypatch):
    write_deb(tmp_path / "firefox-esr-l10n-th_140.1%3a2_all.deb", {})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    got = fetch_debs(["firefox-esr-l10n-th"], tmp_path)  # cached: no client needed
    assert got["firefox-esr-l10n-th"].version == "140.1:2"
    with pytest.raises(FileNotFoundError, match="apt-get not found.*unicode-cldr-core"):
        fetch_debs(["firefox-esr-l10n-th", "unicode-cldr-core"], tmp_path)


def test_registry_refuses_a_duplicate_and_names_the_known_sources():
    with pytest.raises(ValueError, match="already registered"):
        register_source(name="cldr", license="x", format="x", locales={}, package=None, shared=())(
            lambda *a: []
        )
    with pytest.raises(ValueError, match="known: .*firefox"):
        source("wikipedia")
    assert SOURCES["firefox"].packages("th") == ["firefox-esr-l10n-th", "firefox-esr-l10n-en-gb"]
    assert SOURCES["firefox"].packages("lo") == []


@pytest.mark.parametrize(
    "english, target, reason",
    [
        ("Open the file", "เปิดแฟ้ม", None),
        ("Open the file", "Open the file", "identical"),
        ("Open the file", "", "empty"),
        ("42", "๔๒", "no_letters"),
        ("Open the file", "เปิดแฟ้มเปิดแฟ้มเปิดแฟ้มเปิดแฟ้มเปิดแฟ้มเปิดแฟ้มเปิดแฟ้ม", "length"),
        ("Open the file now please", "open the file now please", "identical"),
        ("Open the recent file list", "open the recent แฟ้ม list", "mixing"),
    ],
)
def test_drop_reason(english, target, reason, tmp_path):
    plan = BitextPlan(langs=["th"], cache=tmp_path, out=tmp_path)
    assert drop_reason(english, target, "th", plan) == reason


def _langpack(locale: str, messages: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as xpi:
        ftl = "".join(f"{k} = {v}\n" for k, v in messages.items())
        xpi.writestr(f"localization/{locale}/browser/menu.ftl", ftl)
    return buffer.getvalue()


ENGLISH = {f"m{i}": f"Open the saved file number {w} now" for i, w in enumerate(["one", "two", "three"])}
ENGLISH |= {"tab": "New Tab", "same": "Firefox Sync", "key.accesskey": "N", "dup": "New Tab"}
THAI = {f"m{i}": f"เปิดแฟ้มที่บันทึกไว้หมายเลข {w} ตอนนี้" for i, w in enumerate(["หนึ่ง", "สอง", "สาม"])}
THAI |= {"tab": "แท็บใหม่", "same": "Firefox Sync", "key.accesskey": "ม", "dup": "แท็บใหม่"}


def _fixture_cache(cache: Path) -> None:
    for locale, messages, version in (("en-GB", ENGLISH, "140.12.0esr-1"), ("th", THAI, "140.12.0esr-1")):
        name = f"firefox-esr-l10n-{locale.lower()}_{version}_all.deb"
        write_deb(
            cache / name,
            {f"usr/lib/firefox-esr/browser/extensions/langpack-{locale}.xpi": _langpack(locale, messages)},
        )


def test_build_on_fixture_packages_filters_splits_and_writes_the_manifest(tmp_path):
    _fixture_cache(tmp_path / "debs")
    plan = BitextPlan(
        langs=["th"], cache=tmp_path / "debs", out=tmp_path / "out", sources=["firefox"], heldout=1
    )
    manifest = build_parallel_corpus(plan, log=lambda *_: None)
    train = [json.loads(x) for x in (tmp_path / "out/th/train.jsonl").read_text().splitlines()]
    held = [json.loads(x) for x in (tmp_path / "out/th/heldout.jsonl").read_text().splitlines()]
    assert len(held) == 1 and len(held[0]["en"].split()) >= 4
    kept = {r["en"] for r in train + held}
    # the access key and the untranslated brand are dropped; "New Tab" is kept once
    assert kept == {*(v for k, v in ENGLISH.items() if k.startswith("m")), "New Tab"}
    assert manifest["pairs_total"] == {"th": 3} and manifest["heldout"] == {"th": 1}
    assert manifest["dropped"]["th"] == {"duplicate": 1, "identical": 1}
    th = next(s for s in manifest["sources"] if s["package"] == "firefox-esr-l10n-th")
    assert th == {"source": "firefox", "package": "firefox-esr-l10n-th", "version": "140.12.0esr-1",
                  "license": "MPL-2.0", "format": "Fluent .ftl, .properties", "pairs": {"th": 4}}  # fmt: skip
    assert json.loads((tmp_path / "out/data.json").read_text()) == manifest


def test_the_tool_says_in_one_line_when_the_package_client_is_missing(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # python, but no apt-get
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools/build_parallel_corpus.py"), "--langs", "th", "--sources", "cldr",
         "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "debs")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "apt-get not found" in result.stderr and "unicode-cldr-core" in result.stderr
