"""Readers for the localisation formats that carry parallel text, each to {key: text}.

    read_mo(data)            gettext .mo (binary): {msgctxt\\x04msgid: msgstr}; msgid is the English
    read_po(text)            gettext .po: the same mapping from the text form
    read_fluent(text)        Mozilla Fluent .ftl: {message id or id.attribute: value}
    read_properties(text)    Java .properties (Firefox's older strings): {key: value}
    read_help_html(text)     LibreOffice help pages: {element id: text}
    read_cldr(data)          Unicode CLDR LDML XML: {element path with its distinguishing attributes: text}

Two files of one format are aligned by key (a message id, a paragraph id, an XML path), except
gettext, whose key is the English itself. Every reader keeps values as written (markup included);
`clean_text` strips what a translation should not contain. A malformed file raises ValueError
naming what is wrong.
"""

from __future__ import annotations

import html
import re
import struct
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

MO_MAGIC = (0x950412DE, 0xDE120495)
CONTEXT_SEPARATOR = "\x04"


def read_mo(data: bytes, name: str = "<mo>") -> dict[str, str]:
    """A compiled gettext catalog: {msgid (with "ctx\\x04" in front when it has a context): msgstr}.
    Plural entries keep their singular forms; the header (empty msgid) and untranslated entries are
    left out."""
    if len(data) < 20:
        raise ValueError(f"{name}: {len(data)} bytes is too short for a gettext .mo file")
    for order in ("<", ">"):
        magic, _revision, count, ids_at, strs_at = struct.unpack(f"{order}5I", data[:20])
        if magic == MO_MAGIC[0]:
            break
    else:
        raise ValueError(f"{name}: not a gettext .mo file (magic {data[:4].hex()})")

    def string(table: int, i: int) -> str:
        length, offset = struct.unpack(f"{order}2I", data[table + 8 * i : table + 8 * i + 8])
        if offset + length > len(data):
            raise ValueError(f"{name}: string {i} runs past the end of the file")
        return data[offset : offset + length].decode("utf-8", errors="replace")

    out = {}
    for i in range(count):
        msgid, msgstr = string(ids_at, i).split("\0")[0], string(strs_at, i).split("\0")[0]
        if msgid and msgstr:
            out[msgid] = msgstr
    return out


_PO_FIELD = re.compile(r'^(msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?)\s+"(.*)"$')
_PO_CONTINUATION = re.compile(r'^"(.*)"$')
_PO_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _po_unquote(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _PO_ESCAPES.get(m.group(1), m.group(1)), text)


def read_po(text: str, name: str = "<po>") -> dict[str, str]:
    """A gettext .po catalog (entries separated by blank lines), the same mapping as read_mo;
    fuzzy entries are left out."""
    out: dict[str, str] = {}
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        field, fuzzy = None, False
        for line in block.splitlines():
            line = line.strip()
            if line.startswith("#"):
                fuzzy = fuzzy or (line.startswith("#,") and "fuzzy" in line)
            elif match := _PO_FIELD.match(line):
                field, value = match.groups()
                fields[field] = _po_unquote(value)
            elif (match := _PO_CONTINUATION.match(line)) and field:
                fields[field] += _po_unquote(match.group(1))
            elif line:
                raise ValueError(f"{name}: not a .po line: {line[:80]!r}")
        msgid, msgstr = fields.get("msgid", ""), fields.get("msgstr", fields.get("msgstr[0]", ""))
        if msgid and msgstr and not fuzzy:
            out[fields["msgctxt"] + CONTEXT_SEPARATOR + msgid if "msgctxt" in fields else msgid] = msgstr
    return out


_FLUENT_ENTRY = re.compile(r"^(-?[A-Za-z][\w-]*)\s*=\s?(.*)$")
_FLUENT_ATTRIBUTE = re.compile(r"^\s+\.([A-Za-z][\w-]*)\s*=\s?(.*)$")


def read_fluent(text: str, name: str = "<ftl>") -> dict[str, str]:
    """Messages and terms of a Fluent file: {id: value, id.attribute: value}. Multi-line values
    are joined by spaces; values with a selector (`{ $n -> ...}`) are left out (their variants
    are not one sentence)."""
    out: dict[str, str] = {}
    key: str | None = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            key = None if line.startswith("#") else key
            continue
        if match := _FLUENT_ENTRY.match(line):
            key, value = match.groups()
            out[key] = value.strip()
            message = key
        elif key is not None and (match := _FLUENT_ATTRIBUTE.match(line)):
            key = f"{message}.{match.group(1)}"
            out[key] = match.group(2).strip()
        elif key is not None and line[:1].isspace():
            out[key] = f"{out[key]} {line.strip()}".strip()
        else:
            key = None  # a line of a construct this reader does not follow (ignored to its end)
    return {k: v for k, v in out.items() if v and "->" not in v}


_UNICODE_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")


def read_properties(text: str, name: str = "<properties>") -> dict[str, str]:
    """key = value lines; # and ! start comments, a trailing backslash continues a line."""
    out: dict[str, str] = {}
    pending = ""
    for line in text.splitlines():
        line = pending + line.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = _UNICODE_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), value.strip())
    return out


class _HelpParser(HTMLParser):
    """Collects the text of every element with an id among p, h1-h6, td and li, skipping hidden
    spans (LibreOffice's per-platform variants) and nested ids (their own entries)."""

    BLOCKS = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "td", "li"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: dict[str, str] = {}
        self.stack: list[tuple[str, str | None, bool]] = []  # (tag, id collected into, hidden)
        self.parts: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        hidden = "hidden" in a or (bool(self.stack) and self.stack[-1][2])
        target = self.stack[-1][1] if self.stack else None
        if tag in self.BLOCKS and a.get("id"):
            target = a["id"]
            self.parts[target] = []
        if tag not in ("br", "img", "input", "meta", "link", "hr"):
            self.stack.append((tag, target, hidden))

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            open_tag, target, _ = self.stack.pop()
            if target is not None and (not self.stack or self.stack[-1][1] != target):
                self.out[target] = " ".join("".join(self.parts.pop(target, [])).split())
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1][1] is not None and not self.stack[-1][2]:
            self.parts[self.stack[-1][1]].append(data)


def read_help_html(text: str, name: str = "<html>") -> dict[str, str]:
    """LibreOffice help page: {paragraph or heading id: its visible text}."""
    parser = _HelpParser()
    parser.feed(text)
    parser.close()
    return {k: v for k, v in parser.out.items() if v}


# Attributes that tell apart sibling CLDR elements of one tag (the rest describe, e.g. draft).
_CLDR_KEYS = ("type", "cp", "alt", "count", "key", "id", "draft_never")


def read_cldr(data: bytes, name: str = "<ldml>") -> dict[str, str]:
    """Every text-bearing element of a CLDR LDML file (locale data or emoji annotations):
    {"/ldml/localeDisplayNames/languages/language[type=th]": "Thai", ...}."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise ValueError(f"{name}: not well-formed XML ({e})") from None
    out: dict[str, str] = {}

    def walk(element: ET.Element, path: str) -> None:
        attrs = ",".join(f"{k}={element.get(k)}" for k in _CLDR_KEYS if element.get(k) is not None)
        here = f"{path}/{element.tag}" + (f"[{attrs}]" if attrs else "")
        children = list(element)
        if not children and element.text and element.text.strip():
            out[here] = element.text.strip()
        for child in children:
            walk(child, here)

    walk(root, "")
    return out


_TAG = re.compile(r"<[^<>]+>")
_GTK_MNEMONIC = re.compile(r"(?<![\w_])_(?=\w)")
_CJK_ACCESS_KEY = re.compile(r"\s*\((?:_|&|~)\w\)")
_AMP_ACCESS_KEY = re.compile(r"&(?=[^\W\d_])(?![a-zA-Z]+;)")


def clean_text(text: str, markup: bool = True) -> str:
    """One line of translatable text: markup tags dropped (with `markup`), HTML entities decoded,
    access-key markers removed (LibreOffice's ~, GTK's _, Qt's &, and CJK "(_X)" suffixes),
    whitespace collapsed. Placeables ({ $name }, %s, %1$d), names and numbers stay."""
    if markup:
        text = _TAG.sub("", text)
    text = _CJK_ACCESS_KEY.sub("", text)
    text = text.replace("~", "")
    text = _GTK_MNEMONIC.sub("", text)
    text = _AMP_ACCESS_KEY.sub("", text)
    text = html.unescape(text).replace("\\n", " ")
    return " ".join(text.split())
