"""Format-preservation reward r_fmt (SPEC section 5).

Structural tokens of a text (a multiset): HTML/XML tags, Markdown headings, bullet and numbered
list markers, bold/italic emphasis, links and images (by URL), code fences, inline code (by
content), placeholders ({0} {name} {{name}} %s %d %1$s %(name)s ${var}), URLs and e-mail addresses.
Only when the source has structure:

    r_fmt = w_p * |struct(x) ∩ struct(y)| / |struct(x)| - w_b * broken(y)

where broken(y) counts unclosed/mismatched/stray tags, an odd number of code fences, broken
ordered-list numbering, and unbalanced inline-code backticks / bold markers / {{ }} braces.
Broken syntax is counted in excess of the source's own (a faithful copy of an already broken
source is not penalised). Without structure in the source, r_fmt = 0 and the check does not apply.
"""

from __future__ import annotations

from collections import Counter

import regex

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.rewards.registry import TermResult, register_reward
from vepo_mcore.translation.sample import Sample

_VOID_TAGS = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()
)  # HTML elements that never take a closing tag
# Every pattern starts only where a token can start and uses possessive (*+) or bounded
# quantifiers, so matching stays linear on adversarial 100k-character outputs.
_TAG = regex.compile(r"<(/?)([A-Za-z][\w:.-]*+)((?:[\s/][^<>]*+)?)>")
_FENCE = regex.compile(r"^[ \t]*+(```|~~~)", regex.MULTILINE)
_HEADING = regex.compile(r"^[ \t]{0,3}+(#{1,6})[ \t]++\S", regex.MULTILINE)
_BULLET = regex.compile(r"^[ \t]*+[-*+][ \t]++\S", regex.MULTILINE)
_NUMBERED = regex.compile(r"^([ \t]*+)(\d{1,9}+)([.)])[ \t]++\S", regex.MULTILINE)
_UNDERSCORE_BOLD = regex.compile(r"(?<!\w)__(?=[^\s_])[^_\n]++(?<=\S)__(?!\w)")
_ITALIC = regex.compile(r"(?<![\w*])\*(?=[^\s*])[^*\n]++(?<=[^\s*])\*(?![\w*])")
_LINK = regex.compile(r"(!?)\[[^\[\]\n]*+\]\(\s*+([^)\s]{1,500}+)[^)\n]{0,300}+\)")
_INLINE_CODE = regex.compile(r"(?<!`)`([^`\n]++)`(?!`)")
_PLACEHOLDER = regex.compile(
    r"\{\{\s*+[\w.]++\s*+\}\}|(?<!\{)\{\w*+\}(?!\})|\$\{\w++\}"
    r"|%(?:\d++\$)?(?:\(\w++\))?[-+0#]*+\d*+(?:\.\d++)?[sdifFeEgGxXoc%]"
)
_URL = regex.compile(  # ASCII only, without <>"'()[] (so a URL ends before Thai/Chinese text or a ')')
    r"(?:https?|ftp)://[!#-&*-;=?-Z\\^-~]++|(?<![\w.])www\.[!#-&*-;=?-Z\\^-~]++"
)
_EMAIL = regex.compile(r"(?<![\w.+-])[\w.+-]++@[\w-]++(?:\.[\w-]++)++")
_TRAILING_PUNCT = ".,;:!?。，、"


def _strip_code(text: str) -> str:
    """Text with fenced code blocks removed (their content is code, not markup)."""
    out, inside = [], False
    for line in text.split("\n"):
        if _FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            out.append(line)
    return "\n".join(out)


def structure(text: str) -> Counter:
    """Multiset of structural tokens of ``text``, e.g. {("tag", "b"): 1, ("tag", "/b"): 1, ("url", "...")}."""
    tokens: Counter = Counter()
    for fence in _FENCE.findall(text):
        tokens[("fence", fence)] += 1
    body = _strip_code(text)
    for close, name, attrs in _TAG.findall(body):
        kind = "/" if close else ("/>" if attrs.endswith("/") else "")
        tokens[("tag", f"{kind}{name.lower()}")] += 1
    for hashes in _HEADING.findall(body):
        tokens[("heading", len(hashes))] += 1
    tokens[("bullet", "")] += len(_BULLET.findall(body))
    for _indent, number, _delim in _NUMBERED.findall(body):
        tokens[("numbered", int(number))] += 1
    # "**" markers pair up within a line (counting, not matching, keeps long spans and 100k-char
    # outputs cheap); "__bold__" must not touch word characters (snake_case is not emphasis).
    bold = sum(line.count("**") // 2 for line in body.split("\n")) + len(_UNDERSCORE_BOLD.findall(body))
    tokens[("bold", "")] += bold
    tokens[("italic", "")] += len(_ITALIC.findall(body))
    for bang, url in _LINK.findall(body):
        tokens[("image" if bang else "link", url)] += 1
    for code in _INLINE_CODE.findall(body):
        tokens[("code", code.strip())] += 1
    for placeholder in _PLACEHOLDER.findall(body):
        if placeholder != "%%":  # a literal percent sign, not a placeholder
            tokens[("placeholder", placeholder.replace(" ", ""))] += 1
    for url in _URL.findall(body):
        tokens[("url", url.rstrip(_TRAILING_PUNCT))] += 1
    for email in _EMAIL.findall(body):
        tokens[("email", email.rstrip(_TRAILING_PUNCT))] += 1
    return +tokens  # drop zero counts


_QUICK_MARKUP = regex.compile(r"[<`@{}%$]|://|www\.|\]\(")
_LINK_TARGET = regex.compile(r"(?<=\])\(\s*+[^)\s]{1,500}+[^)\n]{0,300}+\)")


def plain_text(text: str) -> str:
    """``text`` without the parts of markup that are not language: code (fenced and inline), tags,
    link targets, URLs, e-mail addresses and placeholders. LID and code-mixing read this, so an
    English tag name or a URL does not count against a Thai translation."""
    if _QUICK_MARKUP.search(text) is None:
        return text
    text = _strip_code(text)
    for pattern in (_INLINE_CODE, _TAG, _LINK_TARGET, _URL, _EMAIL, _PLACEHOLDER):
        text = pattern.sub(" ", text)
    return text


def _tag_errors(body: str) -> int:
    """Unclosed, mismatched and stray closing tags (void and self-closing tags are fine)."""
    stack: list[str] = []
    errors = 0
    for close, name, attrs in _TAG.findall(body):
        name = name.lower()
        if attrs.endswith("/") or name in _VOID_TAGS:
            continue
        if not close:
            stack.append(name)
        elif name in stack:
            while stack[-1] != name:  # every tag opened after `name` was left unclosed
                stack.pop()
                errors += 1
            stack.pop()
        else:
            errors += 1
    return errors + len(stack)


def _numbering_errors(body: str) -> int:
    """Ordered-list items (same indent, consecutive lines) whose number is not previous + 1."""
    errors = 0
    previous: dict[str, int] = {}
    for line in body.split("\n"):
        match = _NUMBERED.match(line)
        if match is None:
            if line.strip() and not line.startswith((" ", "\t")):
                previous.clear()  # a paragraph ends the list
            continue
        indent, number = match.group(1), int(match.group(2))
        if indent in previous and number != previous[indent] + 1:
            errors += 1
        previous[indent] = number
    return errors


def broken_syntax(text: str) -> int:
    """Count of broken-syntax items in ``text`` (see module docstring)."""
    body = _strip_code(text)
    errors = _tag_errors(body) + _numbering_errors(body)
    errors += len(_FENCE.findall(text)) % 2
    errors += len(regex.findall(r"(?<!`)`(?!`)", body)) % 2
    errors += body.count("**") % 2
    errors += int(body.count("{{") != body.count("}}"))
    return errors


def format_score(
    source: str, hypothesis: str, w_preserve: float = 1.0, w_broken: float = 0.5
) -> tuple[float, float, int, bool]:
    """(r_fmt, preservation ratio, excess broken count, applicable) for one pair."""
    wanted = structure(source)
    if not wanted:
        return 0.0, 1.0, 0, False
    kept = sum((wanted & structure(hypothesis)).values())
    preserve = kept / sum(wanted.values())
    broken = max(0, broken_syntax(hypothesis) - broken_syntax(source))
    return w_preserve * preserve - w_broken * broken, preserve, broken, True


@register_reward("format", constraint="format")
def format_reward(samples: list[Sample], cfg: RewardsConfig | None = None) -> TermResult:
    """r_fmt per sample; raw = preservation ratio; passed = all structure kept and nothing broken."""
    cfg = cfg or RewardsConfig()
    scores = [format_score(s.source, s.response, cfg.format_w_preserve, cfg.format_w_broken) for s in samples]
    return TermResult(
        values=[score for score, *_ in scores],
        raw=[preserve for _, preserve, _, _ in scores],
        passed=[preserve >= cfg.format_min_preserve and broken == 0 for _, preserve, broken, _ in scores],
        applicable=[applicable for *_, applicable in scores],
    )
