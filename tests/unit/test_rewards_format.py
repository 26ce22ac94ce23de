"""r_fmt: structural tokens, broken syntax, and 36 hand-written (source, good, broken) cases."""

from collections import Counter

import pytest

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.rewards.format import broken_syntax, format_reward, format_score, structure
from vepo_mcore.translation.sample import Sample

# (target language, source, good translation, broken translation). Sources are English or
# another of the ten languages; every "good" keeps all structure, every "broken" loses or breaks some.
CASES = [
    ("zh", "Click <b>Save</b> to continue.", "点击<b>保存</b>继续。", "点击<b>保存继续。"),
    ("th", "Press <kbd>Ctrl</kbd> + <kbd>C</kbd>.", "กด <kbd>Ctrl</kbd> + <kbd>C</kbd>", "กด Ctrl + C"),
    ("vi", "<p>Hello <i>world</i></p>", "<p>Xin chào <i>thế giới</i></p>", "<p>Xin chào <i>thế giới</p></i>"),
    (
        "id",
        "<ul><li>Apples</li><li>Pears</li></ul>",
        "<ul><li>Apel</li><li>Pir</li></ul>",
        "<ul><li>Apel<li>Pir</ul>",
    ),
    ("ms", "Line one<br>line two", "Baris satu<br>baris dua", "Baris satu baris dua"),
    (
        "fil",
        '<a href="/help">Help</a> is here.',
        'Narito ang <a href="/help">Tulong</a>.',
        "Narito ang Tulong.",
    ),
    ("km", '<span class="x">Warning</span>', '<span class="x">ការព្រមាន</span>', '<span class="x">ការព្រមាន'),
    (
        "lo",
        "<strong>Note:</strong> read this.",
        "<strong>ໝາຍເຫດ:</strong> ອ່ານອັນນີ້.",
        "</strong>ໝາຍເຫດ:<strong> ອ່ານອັນນີ້.",
    ),
    ("my", "<em>Important</em> update", "<em>အရေးကြီး</em> အပ်ဒိတ်", "အရေးကြီး အပ်ဒိတ်"),
    ("en", "点击<b>这里</b>。", "Click <b>here</b>.", "Click <b>here</b></b>."),
    ("zh", "# Installation\n\nRun the script.", "# 安装\n\n运行脚本。", "安装\n\n运行脚本。"),
    ("th", "## Settings\n### Advanced", "## การตั้งค่า\n### ขั้นสูง", "## การตั้งค่า\nขั้นสูง"),
    ("vi", "- milk\n- eggs\n- bread", "- sữa\n- trứng\n- bánh mì", "sữa, trứng, bánh mì"),
    (
        "id",
        "1. Open the app\n2. Log in\n3. Pay",
        "1. Buka aplikasi\n2. Masuk\n3. Bayar",
        "1. Buka aplikasi\n2. Masuk\n2. Bayar",
    ),
    ("ms", "1. First\n2. Second", "1. Pertama\n2. Kedua", "1. Pertama\n3. Kedua"),
    ("fil", "This is **very** important.", "Ito ay **napaka** mahalaga.", "Ito ay **napaka mahalaga."),
    ("km", "Use *italic* text.", "ប្រើអក្សរ *ទ្រេត*។", "ប្រើអក្សរទ្រេត។"),
    ("lo", "See [the guide](https://example.com/guide).", "ເບິ່ງ [ຄູ່ມື](https://example.com/guide).", "ເບິ່ງຄູ່ມື."),
    ("my", "![logo](img/logo.png) Welcome", "![လိုဂို](img/logo.png) ကြိုဆိုပါတယ်", "လိုဂို ကြိုဆိုပါတယ်"),
    (
        "en",
        "Jalankan `pip install vepo` dahulu.",
        "Run `pip install vepo` first.",
        "Run pip install vepo first.",
    ),
    (
        "zh",
        "Run:\n```bash\nmake test\n```\nDone.",
        "运行：\n```bash\nmake test\n```\n完成。",
        "运行：\n```bash\nmake test\n完成。",
    ),
    (
        "th",
        "Call `get_user()` then `save()`.",
        "เรียก `get_user()` แล้ว `save()`",
        "เรียก `get_user() แล้ว save()",
    ),
    (
        "vi",
        "Hello {name}, you have {count} messages.",
        "Xin chào {name}, bạn có {count} tin nhắn.",
        "Xin chào {tên}, bạn có {count} tin nhắn.",
    ),
    ("id", "File {0} of {1}", "Berkas {0} dari {1}", "Berkas {0} dari"),
    ("ms", "Welcome, %s!", "Selamat datang, %s!", "Selamat datang!"),
    ("fil", "%d items left", "%d na item ang natitira", "may natitirang item"),
    ("km", "Hi {{user}}!", "សួស្តី {{user}}!", "សួស្តី {{user}!"),
    ("lo", "Price: ${amount}", "ລາຄາ: ${amount}", "ລາຄາ: amount"),
    (
        "my",
        "Visit https://vepo.example.org/docs for details.",
        "အသေးစိတ်အတွက် https://vepo.example.org/docs ကိုကြည့်ပါ။",
        "အသေးစိတ်အတွက် ဝက်ဘ်ဆိုက်ကိုကြည့်ပါ။",
    ),
    ("en", "Hubungi support@vepo.example.org.", "Contact support@vepo.example.org.", "Contact support."),
    (
        "zh",
        'Email <a href="mailto:a@b.org">a@b.org</a> now',
        '现在发邮件给 <a href="mailto:a@b.org">a@b.org</a>',
        "现在发邮件给 a@b.org",
    ),
    (
        "th",
        "**Step 1:** open `config.yaml`",
        "**ขั้นตอนที่ 1:** เปิด `config.yaml`",
        "**ขั้นตอนที่ 1: เปิด config.yaml",
    ),
    (
        "vi",
        "# Title\n\n- see [docs](http://x.org)\n- run `make`",
        "# Tiêu đề\n\n- xem [tài liệu](http://x.org)\n- chạy `make`",
        "Tiêu đề\n\nxem tài liệu, chạy make",
    ),
    (
        "id",
        "<h1>News</h1><p>Today: {date}</p>",
        "<h1>Berita</h1><p>Hari ini: {date}</p>",
        "<h1>Berita<p>Hari ini: {date}</p>",
    ),
    (
        "fil",
        "Progress: 50%% done, %(n)s files",
        "Progreso: 50%% tapos, %(n)s na file",
        "Progreso: kalahati na, mga file",
    ),
    (
        "ms",
        "Go to www.vepo.example.org or <code>vepo --help</code>.",
        "Pergi ke www.vepo.example.org atau <code>vepo --help</code>.",
        "Pergi ke laman web atau <code>vepo --help.",
    ),
]


def test_there_are_at_least_30_cases_across_all_ten_languages():
    assert len(CASES) >= 30
    assert {lang for lang, *_ in CASES} == {"en", "zh", "th", "ms", "km", "lo", "my", "fil", "id", "vi"}


@pytest.mark.parametrize("lang,source,good,broken", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_good_keeps_structure_and_broken_is_caught(lang, source, good, broken):
    assert structure(source), "every case source has structure"
    reward, preserve, n_broken, applicable = format_score(source, good)
    assert applicable and preserve == 1.0 and n_broken == 0 and reward == 1.0
    bad_reward, bad_preserve, bad_broken, _ = format_score(source, broken)
    assert bad_reward < reward
    assert bad_preserve < 1.0 or bad_broken > 0
    cfg = RewardsConfig()
    result = format_reward(
        [
            Sample(source=source, response=good, tgt_lang=lang),
            Sample(source=source, response=broken, tgt_lang=lang),
        ],
        cfg,
    )
    assert result.passed == [True, False] and result.applicable == [True, True]


def test_formula_matches_a_hand_computation():
    # struct(x) = {<b>, </b>, {0}, {1}}; y keeps <b>, </b>, {0} and leaves <b> unclosed twice over.
    source = "Click <b>Save</b> for {0} and {1}"
    hypothesis = "Klik <b>Simpan</b> untuk {0} <i><u>"
    reward, preserve, broken, applicable = format_score(source, hypothesis, w_preserve=1.0, w_broken=0.5)
    assert applicable and preserve == pytest.approx(3 / 4) and broken == 2
    assert reward == pytest.approx(1.0 * 3 / 4 - 0.5 * 2)


def test_structure_is_a_multiset():
    assert structure("{0} {0} {1}") == Counter({("placeholder", "{0}"): 2, ("placeholder", "{1}"): 1})
    # Keeping one of two {0} preserves 2 of 3 items.
    assert format_score("{0} {0} {1}", "{0} {1}")[1] == pytest.approx(2 / 3)


def test_no_structure_means_zero_reward_and_not_applicable():
    for text in ["The cat sat on the mat.", "今天天气很好。", "50% off, 3 < 4 and 5 > 2", "ราคา 100 บาท"]:
        assert structure(text) == Counter(), text
        assert format_score(text, "anything <b>") == (0.0, 1.0, 0, False)


def test_broken_syntax_counts():
    assert broken_syntax("<b>x</b> <br> <img src='a.png'/> <p>ok</p>") == 0
    assert broken_syntax("<b>x") == 1
    assert broken_syntax("<b><i>x</b>") == 1  # <i> left unclosed inside <b>
    assert broken_syntax("x</b>") == 1
    assert broken_syntax("```\ncode\n") == 1
    assert broken_syntax("```\ncode\n```") == 0
    assert broken_syntax("1. a\n2. b\n4. c") == 1
    assert broken_syntax("1. a\n2. b\n\nText.\n\n1. new list") == 0
    assert broken_syntax("**bold") == 1 and broken_syntax("`code") == 1 and broken_syntax("{{x}") == 1


def test_code_inside_fences_is_not_markup():
    source = "```\nif a < b and c > d: x = '<b>'\n```"
    assert broken_syntax(source) == 0
    assert ("tag", "b") not in structure(source)


def test_source_broken_syntax_is_not_charged_to_the_translation():
    source = "Click <b>Save to continue."  # already unclosed
    assert format_score(source, "Klik <b>Simpan untuk melanjutkan.") == (1.0, 1.0, 0, True)


def test_long_spans_are_still_structure():
    long_text = "ထိုသို့သော " * 200  # 2,200 characters of Burmese inside a link and in bold
    source = f"[{long_text}](https://example.org/doc) **{long_text}**"
    assert structure(source)[("link", "https://example.org/doc")] == 1
    assert structure(source)[("bold", "")] == 1
    assert format_score(source, source) == (1.0, 1.0, 0, True)
