"""The openly licensed parallel text inside Debian packages, one registered extractor per family.

    SOURCES["firefox"].extract(debs, "th")    # [(english, thai, key), ...] aligned by message id

Each source names its packages per language (and the English reference package it aligns
against), its license and format; `extract` returns raw aligned pairs, which build.py cleans and
filters. Registering a new family is one function with @register_source.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from vepo_mcore.bitext.debs import Deb, deb_members
from vepo_mcore.bitext.formats import (
    CONTEXT_SEPARATOR,
    read_cldr,
    read_fluent,
    read_help_html,
    read_mo,
    read_properties,
)

Pair = tuple[str, str, str]
"""(English text, target text, where it came from: file and key)."""


@dataclass(frozen=True)
class Source:
    """A family of packages that carry the same strings in English and in our languages."""

    name: str
    license: str
    format: str
    locales: dict[str, str]
    """project language code -> the package's locale name (th, tl, zh-cn ...)."""
    package: str | None
    """The target language's package, {locale} in its name (None: the shared packages hold every language)."""
    shared: tuple[str, ...]
    """Packages read for every language: the English reference, or catalogs of many languages."""
    extract: Callable[[dict[str, Deb], str, str], list[Pair]] = field(repr=False)
    """(fetched packages, project language, locale) -> aligned pairs."""
    licenses: dict[str, str] = field(default_factory=dict)
    """Per-package license where a family's packages differ."""

    def packages(self, lang: str) -> list[str]:
        """Every package this source reads for `lang` (none when it has no text in that language)."""
        if lang not in self.locales:
            return []
        return [*([self.package.format(locale=self.locales[lang])] if self.package else []), *self.shared]

    def license_of(self, package: str) -> str:
        return self.licenses.get(package, self.license)


SOURCES: dict[str, Source] = {}


def register_source(**fields) -> Callable:
    """Register the decorated extractor as SOURCES[name]; a duplicate name is refused."""

    def wrap(extract: Callable) -> Callable:
        if fields["name"] in SOURCES:
            raise ValueError(
                f"parallel-text source {fields['name']!r} is already registered by "
                f"{SOURCES[fields['name']].extract.__module__}"
            )
        SOURCES[fields["name"]] = Source(extract=extract, **fields)
        return extract

    return wrap


def source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise ValueError(f"unknown parallel-text source {name!r}; known: {', '.join(SOURCES)}") from None


def _align(english: dict[str, str], target: dict[str, str], where: str) -> list[Pair]:
    return [(english[k], target[k], f"{where}:{k}") for k in sorted(english.keys() & target.keys())]


def _by_locale(name: str, locale: str) -> str:
    """A package path with its locale segments replaced by LOCALE, so two languages' files match."""
    return "/".join(
        "LOCALE" if part.lower() == locale.lower() else part for part in PurePosixPath(name).parts
    )


def _xpi_files(deb: Deb, locale: str) -> dict[str, tuple[str, str]]:
    """{path with LOCALE: (format, text)} of the .ftl and .properties files in a language pack."""
    out = {}
    for _, data in deb_members(deb.path, suffixes=(".xpi",)):
        with zipfile.ZipFile(io.BytesIO(data)) as xpi:
            for name in xpi.namelist():
                if name.endswith((".ftl", ".properties")):
                    out[_by_locale(name, locale)] = (
                        name.rsplit(".", 1)[1],
                        xpi.read(name).decode("utf-8", "replace"),
                    )
    return out


_ACCESS_KEY_ATTRIBUTES = re.compile(
    r"\.(accesskey|commandkey|key|keycode|style|width|height)$|accesskey", re.I
)


@register_source(
    name="firefox", license="MPL-2.0", format="Fluent .ftl, .properties",
    locales={"th": "th", "vi": "vi", "km": "km", "my": "my", "id": "id", "ms": "ms", "fil": "tl", "zh": "zh-cn"},
    package="firefox-esr-l10n-{locale}", shared=("firefox-esr-l10n-en-gb",),
)  # fmt: skip
def firefox(debs: dict[str, Deb], lang: str, locale: str) -> list[Pair]:
    """Firefox language packs, aligned by file and message id against the en-GB pack."""
    english = _xpi_files(debs["firefox-esr-l10n-en-gb"], "en-GB")
    target = _xpi_files(debs[f"firefox-esr-l10n-{locale}"], locale)
    readers = {"ftl": read_fluent, "properties": read_properties}
    pairs = []
    for path in sorted(english.keys() & target.keys()):
        kind, text = english[path]
        pairs += _align(readers[kind](text, path), readers[kind](target[path][1], path), path)
    return [p for p in pairs if not _ACCESS_KEY_ATTRIBUTES.search(p[2].rsplit(":", 1)[1])]


def _help_pages(deb: Deb) -> dict[str, str]:
    """{page path with LOCALE: html} of a LibreOffice help package."""
    out = {}
    for name, data in deb_members(deb.path, suffixes=(".html",)):
        parts = name.split("/help/", 1)
        if len(parts) == 2 and "/text/" in parts[1]:
            out["LOCALE/" + parts[1].split("/", 1)[1]] = data.decode("utf-8", "replace")
    return out


@register_source(
    name="libreoffice-help", license="MPL-2.0", format="LibreOffice help HTML",
    locales={"vi": "vi", "km": "km", "id": "id", "zh": "zh-cn"},
    package="libreoffice-help-{locale}", shared=("libreoffice-help-en-us",),
)  # fmt: skip
def libreoffice_help(debs: dict[str, Deb], lang: str, locale: str) -> list[Pair]:
    """LibreOffice help, paragraphs and headings aligned by page and element id."""
    english = _help_pages(debs["libreoffice-help-en-us"])
    target = _help_pages(debs[f"libreoffice-help-{locale}"])
    pairs = []
    for page in sorted(english.keys() & target.keys()):
        pairs += _align(read_help_html(english[page], page), read_help_html(target[page], page), page)
    return pairs


def _catalog_pairs(deb: Deb, locale_dirs: tuple[str, ...]) -> list[Pair]:
    """(msgid, msgstr) of every .mo file of a package under a locale folder named in locale_dirs."""
    pairs = []
    for name, data in deb_members(deb.path, suffixes=(".mo",)):
        parts = name.split("/")
        if "LC_MESSAGES" in parts and parts[parts.index("LC_MESSAGES") - 1] in locale_dirs:
            for msgid, msgstr in read_mo(data, name).items():
                pairs.append((msgid.split(CONTEXT_SEPARATOR)[-1], msgstr, f"{deb.package}:{name}:{msgid}"))
    return pairs


@register_source(
    name="libreoffice-ui", license="MPL-2.0", format="gettext .mo",
    locales={"th": "th", "vi": "vi", "km": "km", "id": "id", "zh": "zh-cn"},
    package="libreoffice-l10n-{locale}", shared=(),
)  # fmt: skip
def libreoffice_ui(debs: dict[str, Deb], lang: str, locale: str) -> list[Pair]:
    """LibreOffice's interface strings (the msgid is the English)."""
    return _catalog_pairs(debs[f"libreoffice-l10n-{locale}"], (locale, locale.split("-")[0] + "-CN"))


GETTEXT_PACKAGES = {
    "coreutils": "GPL-3+", "dpkg": "GPL-2+", "apt": "GPL-2+", "libc-l10n": "LGPL-2.1+",
    "libglib2.0-data": "LGPL-2.1+", "libgtk-3-common": "LGPL-2+", "git": "GPL-2", "iso-codes": "LGPL-2.1+",
    "bash": "GPL-3+", "grep": "GPL-3+", "sed": "GPL-3+", "tar": "GPL-3+", "findutils": "GPL-3+",
    "diffutils": "GPL-3+", "gnupg-l10n": "GPL-3+", "util-linux-locales": "GPL-2+", "wget": "GPL-3+",
}  # fmt: skip
"""Debian packages whose gettext catalogs are translated into several of our languages (license
as each package's debian/copyright states it)."""
_GETTEXT_LOCALES = {"th": "th", "vi": "vi", "id": "id", "ms": "ms", "km": "km", "my": "my", "lo": "lo",
                    "fil": "fil", "zh": "zh_CN"}  # fmt: skip


def _gettext(debs: dict[str, Deb], lang: str, locale: str) -> list[Pair]:
    """Programs' message catalogs in /usr/share/locale (the msgid is the English)."""
    dirs = (locale, "tl") if lang == "fil" else (locale,)
    return [pair for package in GETTEXT_PACKAGES for pair in _catalog_pairs(debs[package], dirs)]


register_source(
    name="gettext", license="GPL/LGPL (per package)", format="gettext .mo", locales=_GETTEXT_LOCALES,
    package=None, shared=tuple(GETTEXT_PACKAGES), licenses=GETTEXT_PACKAGES,
)(_gettext)  # fmt: skip


def _cldr_files(deb: Deb, locale: str) -> Iterator[tuple[str, bytes]]:
    for name, data in deb_members(deb.path, suffixes=(f"/main/{locale}.xml", f"/annotations/{locale}.xml")):
        yield name.rsplit("/", 2)[-2], data


@register_source(
    name="cldr", license="Unicode-DFS-2016", format="CLDR LDML XML",
    locales={"th": "th", "vi": "vi", "km": "km", "lo": "lo", "my": "my", "id": "id", "ms": "ms",
             "fil": "fil", "zh": "zh"},
    package=None, shared=("unicode-cldr-core",),
)  # fmt: skip
def cldr(debs: dict[str, Deb], lang: str, locale: str) -> list[Pair]:
    """Unicode CLDR: display names, calendar terms, units and emoji annotations, aligned by path."""
    deb = debs["unicode-cldr-core"]
    english = {kind: read_cldr(data, kind) for kind, data in _cldr_files(deb, "en")}
    target = {kind: read_cldr(data, kind) for kind, data in _cldr_files(deb, locale)}
    return [
        p
        for kind in sorted(english.keys() & target.keys())
        for p in _align(english[kind], target[kind], kind)
    ]
